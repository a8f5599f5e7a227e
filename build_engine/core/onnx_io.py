"""Safe ONNX loading and atomic saving.

``load_model`` refuses, with one line naming the file and the fix: a missing or empty file, bytes that are not an
ONNX model, a truncated model, external data that is missing, short, or whose location escapes the model's folder
(absolute path, ``..``, or a symlink pointing outside), and graphs with a dangling input or a cycle. Nothing outside
the model's folder is ever opened.

``save_model`` stages in ``.trtforge-staging`` beside the output and renames, so a crash leaves no half-written model.
Models that came with external data (or are too big for one protobuf) are written with external data beside the
output, in ``<output name>.data`` (or ``<output name>.<hex>.data`` while that name is taken: the model file's rename
is the commit point, see ``model_commit``).

``skeleton`` and ``check_model``: onnx's checker and shape inference serialise the whole model (weights included)
and parse it again in C++; for a model of tens of MB that costs more than everything else trtforge does. They run
here on a weight-free skeleton (each big initializer stood in for by a graph input of the same name, type and
shape), and ``check_model`` checks each stood-in tensor on its own with ``check_tensor`` under the model's IR version
and opsets, so it rejects what ``onnx.checker.check_model`` rejects.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto

from .errors import InputError, ModelError
from .graph import PROTO_LIMIT, stable_topo_order

# Above this size a model must be saved with external data (protobuf's hard limit is 2 GiB).
_EXTERNAL_THRESHOLD = PROTO_LIMIT
# Initializers with at least this many elements are stood in for by typed graph inputs in ``skeleton``. Smaller ones
# stay: shape inference reads the values of small constants (Reshape targets, Slice bounds, ...).
SKELETON_MIN_ELEMENTS = 1024
# ``doc_string`` of the Mul that ``trtforge quantize`` puts on a projection's input edge (x / s: SmoothQuant or AWQ
# migration). A pass that needs the projection's float input (``lora inject`` after quantization) walks back
# through DequantizeLinear <- QuantizeLinear <- this Mul.
MIGRATION_DOC = "trtforge.quantize: activation / migration scale"


@dataclass(frozen=True)
class LoadedModel:
    model: ModelProto
    path: Path
    external_data: bool
    data_files: tuple[Path, ...] = ()  # the external data files read (for the output-overwrites-input check)


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_opset(model: ModelProto, path: Path) -> None:
    """Refuse a default-domain opset newer than the installed onnx knows (its ops' semantics are unknown here, and
    neither the checker nor TensorRT would say so)."""
    known = onnx.defs.onnx_opset_version()
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx") and op.version > known:
            raise ModelError(f"{path}: opset {op.version} is newer than the newest this onnx knows ({known}); "
                             f"re-export with opset <= {known} or upgrade onnx")


def _all_tensors(graph: GraphProto) -> Iterator[TensorProto]:
    """Every TensorProto in a graph: initializers, tensor attributes, and those of subgraphs (recursively)."""
    yield from graph.initializer
    yield from _node_tensors(graph.node)


def _node_tensors(nodes: Iterable[NodeProto]) -> Iterator[TensorProto]:
    """The tensors of the nodes' attributes, and every tensor of their subgraphs (recursively)."""
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for g in attr.graphs:
                yield from _all_tensors(g)


def _tensors_besides_initializers(model: ModelProto) -> Iterator[TensorProto]:
    """``_model_tensors`` without the main graph's initializers: node attributes, subgraphs (initializers included),
    functions."""
    yield from _node_tensors(model.graph.node)
    for fn in model.functions:
        for node in fn.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t


def _model_tensors(model: ModelProto) -> Iterator[TensorProto]:
    yield from _all_tensors(model.graph)
    for fn in model.functions:
        for node in fn.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t


def external_locations(model: ModelProto) -> list[str]:
    """The distinct external data ``location`` values of a model (relative to its folder), in first-use order."""
    locs: dict[str, None] = {}
    for tensor in _model_tensors(model):
        if tensor.data_location == TensorProto.EXTERNAL:
            for e in tensor.external_data:
                if e.key == "location" and e.value:
                    locs[e.value] = None
    return list(locs)


def _int_field(info: dict[str, str], key: str, where: str) -> int | None:
    text = info.get(key)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ModelError(f"{where} with {key} {text!r}, which is not a whole number; re-export the model") from None
    if value < 0:
        raise ModelError(f"{where} with negative {key} {value}; re-export the model")
    return value


def _check_external(model: ModelProto, path: Path) -> tuple[Path, ...]:
    base = path.parent.resolve()
    found: dict[Path, None] = {}
    for tensor in _model_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        loc = info.get("location", "")
        where = f"{path}: initializer {tensor.name!r} has external data location {loc!r}"
        if not loc:
            raise ModelError(f"{where} which is empty; re-export the model with valid external data")
        rel = Path(loc)
        if rel.is_absolute() or ".." in rel.parts:
            raise ModelError(
                f"{where} that escapes the model's folder; keep the data file beside the model and use a relative name"
            )
        target = (base / rel).resolve()
        if base not in target.parents:
            raise ModelError(f"{where} that resolves outside the model's folder; copy the data file beside the model")
        if not target.is_file():
            raise ModelError(f"{where} but that file is missing; copy {rel} beside {path.name}")
        found[path.parent / rel] = None
        size = target.stat().st_size
        offset = _int_field(info, "offset", where) or 0
        length = _int_field(info, "length", where)
        if offset > size or (length is not None and offset + length > size):
            raise ModelError(f"{where} but the file is too short ({size} bytes); the data file is truncated")
    return tuple(found)


def check_graph_structure(graph: GraphProto, where: str, outer: Iterable[str] = ()) -> None:
    """Refuse dangling inputs and cycles; sort nodes topologically in place if they are merely out of order."""
    available: set[str] = set(outer) | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    available |= {t.name for t in graph.sparse_initializer}
    available.add("")  # optional inputs
    producer: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        for out in node.output:
            if out:
                producer[out] = idx
    for node in graph.node:
        for attr in node.attribute:
            subs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
            for sub in subs:
                check_graph_structure(sub, where, available | set(producer))
    deps: list[set[int]] = []
    for node in graph.node:
        d: set[int] = set()
        for name in node.input:
            if name in producer:
                d.add(producer[name])
            elif name not in available:
                raise ModelError(
                    f"{where}: node {node.name or node.op_type!r} reads {name!r}, which no node, input or initializer "
                    "produces (dangling input); fix the export or add the missing input"
                )
        deps.append(d)
    order = stable_topo_order(deps)
    if len(order) != len(graph.node):
        placed = set(order)
        stuck = next(graph.node[i] for i in range(len(deps)) if i not in placed)
        raise ModelError(
            f"{where}: the graph has a cycle through node {stuck.name or stuck.op_type!r}; ONNX graphs must be "
            "acyclic, re-export the model"
        )
    if order != list(range(len(order))):
        # Acyclic but out of order: the stable order keeps the original one wherever it is already valid.
        nodes = [graph.node[i] for i in order]
        del graph.node[:]
        graph.node.extend(nodes)


def read_model_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the model file at ``path``; a missing path, a folder or an empty file is refused in one line."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file; check the path")
    if p.is_dir():
        raise InputError(f"{p} is a folder; give the path of an .onnx file")
    if p.stat().st_size == 0:
        raise ModelError(f"{p}: the file is empty; re-export the model")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror}); check its permissions") from exc
    if not data:
        raise ModelError(f"{p}: the file is empty; re-export the model")
    return data


def load(path: str | os.PathLike[str], *, check: bool = True, data: bytes | None = None,
         lazy: bool = False) -> LoadedModel:
    """Load and validate an ONNX model (see ``_load``), shown as the step "load"."""
    from . import steps

    with steps.step(f"load {Path(path).name}"):
        return _load(path, check=check, data=data, lazy=lazy)


def _load(path: str | os.PathLike[str], *, check: bool = True, data: bytes | None = None,
          lazy: bool = False) -> LoadedModel:
    """Load and validate an ONNX model (see module docstring for what is refused). ``data``: the file's bytes from
    ``read_model_bytes(path)`` when the caller already has them (the builder hashes the same bytes it builds).

    ``lazy``: external tensors of at least ``lazy_weights.LAZY_MIN_BYTES`` stay on disk (their entries still name
    the source's data file; read them with ``lazy_weights``, save with ``save_model(..., source_dir=...)``), so the
    weights are never held in memory; smaller ones are read as usual (inference reads small constants' values)."""
    p = Path(path)
    if data is None:
        data = read_model_bytes(p)
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # google.protobuf.message.DecodeError and friends
        raise ModelError(
            f"{p}: not a valid ONNX model (protobuf parse failed: the file is truncated or not ONNX); re-export it"
        ) from exc
    if not model.opset_import or not model.HasField("graph") or model.ir_version <= 0:
        raise ModelError(f"{p}: not an ONNX model (no graph, IR version or opset); pass an .onnx file")
    check_opset(model, p)
    data_files = _check_external(model, p)
    external = bool(data_files)
    if external:
        try:
            if lazy:
                from .lazy_weights import load_small_external

                load_small_external(model.graph.initializer, p.parent)
                # Only main-graph initializers may stay on disk (the save copies those); every other tensor is read.
                load_small_external(_tensors_besides_initializers(model), p.parent, min_bytes=1 << 62)
            else:
                onnx.external_data_helper.load_external_data_for_model(model, str(p.parent))
        except Exception as exc:
            raise ModelError(f"{p}: cannot read external data ({exc}); check the data file beside the model") from exc
    if check:
        check_graph_structure(model.graph, str(p))
        for fn in model.functions:
            g = onnx.helper.make_graph(list(fn.node), fn.name, [], [])
            check_graph_structure(g, f"{p} (function {fn.name})", outer=list(fn.input))
        try:
            check_model(model)  # on the skeleton: no full serialisation, and no 2 GiB limit
        except onnx.checker.ValidationError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
            raise ModelError(f"{p}: onnx.checker rejects the model ({first}); fix the export") from exc
    return LoadedModel(model=model, path=p, external_data=external, data_files=data_files)


def _num_elements(tensor: TensorProto) -> int:
    n = 1
    for d in tensor.dims:
        n *= d
    return n


def _copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Copy every set field of protobuf message ``src`` into the empty ``dst`` except field ``skip``. Reads only the
    fields it copies: ``ListFields`` would also hand out the skipped one, and reading a bytes field copies it (a
    weight's ``raw_data``)."""
    for fd in src.DESCRIPTOR.fields:
        if fd.name == skip:
            continue
        if fd.is_repeated:
            value = getattr(src, fd.name)
            if len(value):
                getattr(dst, fd.name).extend(value)
        elif src.HasField(fd.name):
            if fd.message_type is not None:
                getattr(dst, fd.name).CopyFrom(getattr(src, fd.name))
            else:
                setattr(dst, fd.name, getattr(src, fd.name))


def weight_tensors(model: ModelProto, min_elements: int = SKELETON_MIN_ELEMENTS) -> list[TensorProto]:
    """The main graph's initializers that ``skeleton`` stands in for (at least ``min_elements`` elements)."""
    return [t for t in model.graph.initializer if _is_weight(t, min_elements)]


def _is_weight(t: TensorProto, min_elements: int) -> bool:
    """Stood in for by ``skeleton``: a big tensor, or one whose data is still on disk (``load_structure``), whose
    values nothing in memory could read anyway."""
    return _num_elements(t) >= min_elements or t.data_location == TensorProto.EXTERNAL


def without_initializers(model: ModelProto) -> ModelProto:
    """A copy of ``model`` whose main graph has no initializers, everything else unchanged. For code that rebuilds the
    weights itself (precision conversion): the original weights are never copied; the caller adds back the ones it
    keeps, and the result is only valid once it has."""
    out = ModelProto()
    _copy_fields(model, out, "graph")
    _copy_fields(model.graph, out.graph, "initializer")
    return out


def weightless(model: ModelProto, min_elements: int = SKELETON_MIN_ELEMENTS) -> ModelProto:
    """A copy of ``model`` whose main-graph initializers of at least ``min_elements`` elements keep every field but
    their data (name, type, dims; no ``raw_data``): the graph's structure, as the original had it, for code that
    reads only that (input planning, type checks) after the model itself is changed in place. Not a valid model."""
    out = without_initializers(model)
    for t in model.graph.initializer:
        if _num_elements(t) < min_elements:
            out.graph.initializer.append(t)
        else:
            _copy_fields(t, out.graph.initializer.add(), "raw_data")
    return out


def skeleton(model: ModelProto, min_elements: int = SKELETON_MIN_ELEMENTS) -> ModelProto:
    """A copy of ``model`` without its weights: each main-graph initializer of at least ``min_elements`` elements is
    replaced by a graph input of the same name, element type and shape (one already declared as a graph input just
    loses its initializer). The weights are never copied, so this costs what the graph's structure costs.

    What it keeps exact: the checker's and shape inference's view of every node, value and type (only the type and
    shape of a weight matter to them; small initializers keep their values because inference reads them). What it
    leaves to the caller: the weight tensors themselves (``check_model`` checks them one by one), and for a weight that
    is also a declared graph input, the agreement of the declared type with the initializer's.
    """
    skel = without_initializers(model)
    g = skel.graph
    declared = {i.name for i in model.graph.input}
    small = []
    for t in model.graph.initializer:
        if not _is_weight(t, min_elements):
            small.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    g.initializer.extend(small)
    return skel


def check_model(model: ModelProto) -> None:
    """``onnx.checker.check_model(model)`` (raises ``onnx.checker.ValidationError``) without serialising the weights:
    the checker runs on ``skeleton(model)`` and each stood-in weight is checked as ``check_tensor`` checks it (type
    set, one value field of the right kind, enough data for its shape; see ``_check_weight``) under the model's IR
    version and opsets. IR < 4 models
    (whose initializers must also be graph inputs, which the skeleton would hide) get the full check."""
    if model.ir_version < 4:
        onnx.checker.check_model(model)
        return
    onnx.checker.check_model(skeleton(model))
    check_weights(model)


def check_weights(model: ModelProto) -> None:
    """The part of ``check_model`` that the skeleton leaves out: each stood-in weight, as ``check_tensor`` checks it."""
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import}
    for t in weight_tensors(model):
        _check_weight(t, ctx)


# Bits per element of the types whose raw_data size check is done here (anything else gets onnx's own check_tensor).
_BITS = {getattr(TensorProto, name): bits for name, bits in (
    ("FLOAT", 32), ("UINT8", 8), ("INT8", 8), ("UINT16", 16), ("INT16", 16), ("INT32", 32), ("INT64", 64),
    ("BOOL", 8), ("FLOAT16", 16), ("DOUBLE", 64), ("UINT32", 32), ("UINT64", 64), ("BFLOAT16", 16),
    ("FLOAT8E4M3FN", 8), ("FLOAT8E4M3FNUZ", 8), ("FLOAT8E5M2", 8), ("FLOAT8E5M2FNUZ", 8),
    ("UINT4", 4), ("INT4", 4)) if hasattr(TensorProto, name)}
_TYPED_FIELDS = frozenset({"float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"})


def _raw_data_len(tensor: TensorProto) -> int:
    """``len(tensor.raw_data)``. Reading a bytes field makes a transient copy of it (one tensor, freed at once);
    ``ByteSize`` would be worse: protobuf's upb backend serialises the message to size it (twice the tensor)."""
    return len(tensor.raw_data)


def _check_weight(tensor: TensorProto, ctx: Any) -> None:
    """``onnx.checker.check_tensor(tensor, ctx)`` without serialising the weight when it is plainly well formed.

    Fast path, only for the common case (data in ``raw_data`` and nowhere else, a type from ``_BITS``, no negative
    dim, at least as many bytes as the shape needs): the size check is done here and every other check runs on a
    data-free stub (same fields, ``dims=[0]``, empty ``raw_data``). Anything else, including every tensor that would
    fail, is checked by onnx itself on the real tensor, so the errors are onnx's own.
    """
    if tensor.data_location == TensorProto.EXTERNAL:
        # Data still on disk (``load_structure``; its location, offset and length were checked when loading): check
        # everything else on a data-free stand-in, as for an in-memory weight below.
        stub = TensorProto()
        _copy_fields(tensor, stub, "external_data")
        stub.ClearField("data_location")
        del stub.dims[:]
        stub.dims.append(0)
        stub.raw_data = b""
        onnx.checker.check_tensor(stub, ctx)
        return
    bits = _BITS.get(tensor.data_type)
    # HasField/len, not ListFields: reading raw_data copies the weight out (a 1 GB table makes a 1 GB bytes object),
    # so it is read once, for its length, and dropped at once.
    if (bits is None or not tensor.HasField("raw_data") or any(len(getattr(tensor, f)) for f in _TYPED_FIELDS)
            or tensor.data_location == TensorProto.EXTERNAL or any(d < 0 for d in tensor.dims)):
        onnx.checker.check_tensor(tensor, ctx)
        return
    stub = TensorProto()
    _copy_fields(tensor, stub, "raw_data")
    if _raw_data_len(tensor) * 8 < _num_elements(tensor) * bits:
        onnx.checker.check_tensor(tensor, ctx)
        return
    del stub.dims[:]
    stub.dims.append(0)
    stub.raw_data = b""
    onnx.checker.check_tensor(stub, ctx)


def load_model(path: str | os.PathLike[str], *, check: bool = True) -> ModelProto:
    return load(path, check=check).model


_ALIGN = 4096  # data offsets aligned like onnx.save_model's, so onnxruntime can map the file


def _save_external(model: ModelProto, tmp_model: Path, data_name: str, size_threshold: int = 1024,
                   source_dir: Path | None = None) -> None:
    """Write ``model`` to ``tmp_model`` with each main-graph initializer of at least ``size_threshold`` bytes of
    ``raw_data`` in ``tmp_model``'s folder / ``data_name``, without copying the model: the weights are written one at
    a time (a transient copy of one tensor, which reading a protobuf bytes field makes) and the model file is the
    graph with data-free stand-ins pointing into the data file. ``model`` is not changed. Smaller and typed-field
    tensors, and subgraph/attribute tensors, stay in the model file. Tensors still on disk (a lazy load of a model
    in ``source_dir``) are copied byte for byte from their file."""
    out = without_initializers(model)
    pos = 0
    with open(tmp_model.parent / data_name, "wb") as fh:
        for t in model.graph.initializer:
            if t.data_location == TensorProto.EXTERNAL and source_dir is not None:
                from .lazy_weights import copy_tensor

                at, length = copy_tensor(t, source_dir, fh, pos, _ALIGN)
                stub = out.graph.initializer.add()
                _copy_fields(t, stub, "external_data")
                for key, value in (("location", data_name), ("offset", str(at)), ("length", str(length))):
                    e = stub.external_data.add()
                    e.key, e.value = key, value
                pos = at + length
                continue
            if t.data_location == TensorProto.EXTERNAL or not t.HasField("raw_data"):
                out.graph.initializer.append(t)
                continue
            data = t.raw_data  # the one transient copy of this tensor (see ``_raw_data_len``)
            length = len(data)
            if length < size_threshold:
                out.graph.initializer.append(t)
                continue
            stub = TensorProto()
            _copy_fields(t, stub, "raw_data")
            gap = (-pos) % _ALIGN
            fh.write(b"\0" * gap)
            pos += gap
            fh.write(data)
            del data
            for key, value in (("location", data_name), ("offset", str(pos)), ("length", str(length))):
                e = stub.external_data.add()
                e.key, e.value = key, value
            stub.data_location = TensorProto.EXTERNAL
            out.graph.initializer.append(stub)
            pos += length
    if pos == 0:
        (tmp_model.parent / data_name).unlink()  # nothing went out: no empty data file beside the model
    with open(tmp_model, "wb") as fh:
        fh.write(out.SerializeToString())


def save_model(model: ModelProto, path: str | os.PathLike[str], *, external_data: bool | None = None,
               source_dir: Path | None = None) -> None:
    """``_save_model``, shown as the step "save"."""
    from . import steps

    with steps.step(f"save {Path(path).name}"):
        _save_model(model, path, external_data=external_data, source_dir=source_dir)


def _save_model(model: ModelProto, path: str | os.PathLike[str], *, external_data: bool | None = None,
                source_dir: Path | None = None) -> None:
    """Atomically save ``model`` to ``path``; external data goes to a data file beside it (``model_commit``).
    ``source_dir``: the folder of the model that a lazy ``load`` read, whose weights still on disk are copied into
    the output's data."""
    from . import model_commit, staging

    if source_dir is not None:
        from .lazy_weights import has_lazy

        if has_lazy(model):
            external_data = True  # its ByteSize does not count the weights still on disk
    dest = Path(path)
    parent = dest.parent if str(dest.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{dest}: folder {parent} does not exist; create it first or choose another output path")
    if dest.is_dir():
        raise InputError(f"{dest} is a folder; give a file path for the output model")
    if external_data is None:
        external_data = model.ByteSize() >= _EXTERNAL_THRESHOLD
    final = _STAGED_FOR.get(dest, dest)  # a staged_model path: its data is named for the final folder
    data_name = model_commit.fresh_data_name(final.parent, final.name) if external_data else None
    if dest in _STAGED_FOR:  # promote_model commits it
        _write_model(model, dest, data_name, source_dir)
        return
    with staging.staging_dir(parent, dest.name) as entry:
        _write_model(model, entry / dest.name, data_name, source_dir)
        model_commit.commit_model(entry / dest.name, dest, data_name)


def _write_model(model: ModelProto, tmp_model: Path, data_name: str | None, source_dir: Path | None = None) -> None:
    if data_name is not None:
        _save_external(model, tmp_model, data_name, source_dir=source_dir)
    else:
        onnx.save_model(model, str(tmp_model))


# staged_model path -> the destination it will be promoted onto
_STAGED_FOR: dict[Path, Path] = {}


@contextlib.contextmanager
def staged_model(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path with ``dest``'s file name in a private staging folder beside ``dest`` (same filesystem),
    removed on exit. Save a model there (``save_model``), run it by path, then ``promote_model`` it onto ``dest``: so
    a model over 2 GiB can be checked from its file before it replaces anything at ``dest``."""
    from . import staging

    out = Path(dest)
    parent = out.parent if str(out.parent) else Path(".")
    with staging.staging_dir(parent, out.name) as entry:
        staged = entry / out.name
        _STAGED_FOR[staged] = out
        try:
            yield staged
        finally:
            _STAGED_FOR.pop(staged, None)


def promote_model(staged: Path, dest: str | os.PathLike[str]) -> None:
    """Move a model saved by ``save_model`` at a ``staged_model`` path onto ``dest`` by renames (no copy); the
    model file's rename is the commit point (``model_commit``)."""
    from . import model_commit

    out = Path(dest)
    names = [n for n in os.listdir(staged.parent) if n != staged.name and n.endswith(".data")]
    model_commit.commit_model(staged, out, names[0] if names else None)


def load_structure(path: str | os.PathLike[str]) -> LoadedModel:
    """The model at ``path`` with its external data left on disk (tensors keep their ``location``/``offset``
    entries; nothing is read): for commands that change the graph but not the weights (``lora inject``,
    ``lora decompose``, ``diff``'s planning). The external references are checked as ``load`` checks them (inside
    the model's folder, present, long enough) and the graph's structure (dangling inputs, cycles) is checked; onnx's
    checker is not run (it would need the weights). Save the result with ``save_with_source_data``."""
    from . import steps

    p = Path(path)
    with steps.step(f"load {p.name} (graph only)"):
        model = ModelProto()
        try:
            model.ParseFromString(read_model_bytes(p))
        except Exception as exc:
            raise ModelError(f"{p}: not a valid ONNX model (protobuf parse failed: the file is truncated or not "
                             "ONNX); re-export it") from exc
        if not model.opset_import or not model.HasField("graph") or model.ir_version <= 0:
            raise ModelError(f"{p}: not an ONNX model (no graph, IR version or opset); pass an .onnx file")
        check_opset(model, p)
        data_files = _check_external(model, p)
        check_graph_structure(model.graph, str(p))
    return LoadedModel(model=model, path=p, external_data=bool(data_files), data_files=data_files)


def _copy_range(src: Path, dst: Any) -> int:
    """Append file ``src`` to the open file ``dst`` (kernel copy where Linux offers it); returns its size."""
    import shutil

    size = src.stat().st_size
    dst.flush()  # the alignment gap written before, so the kernel copy lands after it
    with open(src, "rb") as fs:
        if hasattr(os, "copy_file_range"):
            left = size
            while left:
                n = os.copy_file_range(fs.fileno(), dst.fileno(), min(left, 1 << 30))
                if n == 0:
                    break
                left -= n
            if left == 0:
                return size
            fs.seek(size - left)
        shutil.copyfileobj(fs, dst, 1 << 24)
    return size


def save_with_source_data(model: ModelProto, source: Path, path: str | os.PathLike[str]) -> None:
    """Atomically save a model loaded by ``load_structure(source)`` to ``path``: its data file ``<name>.data`` is a
    byte copy of every external data file the model names (each at a 4 KiB boundary; one streamed copy, never in
    memory), and each external tensor keeps its offset, shifted by where its file landed. Tensors held in memory
    (new ones) are written after, as ``save_model`` would. The input model and its data are not touched."""
    from . import steps

    dest = Path(path)
    parent = dest.parent if str(dest.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{dest}: folder {parent} does not exist; create it first or choose another output path")
    from .model_commit import fresh_data_name

    data_name = fresh_data_name(parent, dest.name)
    with steps.step(f"save {dest.name} (copying the weights)"), staged_model(dest) as staged:
        out = without_initializers(model)
        base: dict[str, int] = {}
        pos = 0
        with open(staged.with_name(data_name), "wb") as fh:
            for loc in dict.fromkeys(e.value for t in model.graph.initializer for e in t.external_data
                                     if e.key == "location" and t.data_location == TensorProto.EXTERNAL):
                gap = (-pos) % _ALIGN
                fh.write(b"\0" * gap)
                pos += gap
                base[loc] = pos
                pos += _copy_range(source.parent / loc, fh)
            gap = (-pos) % _ALIGN
            fh.write(b"\0" * gap)
        for t in model.graph.initializer:
            if t.data_location != TensorProto.EXTERNAL:
                out.graph.initializer.append(t)
                continue
            moved = out.graph.initializer.add()
            moved.CopyFrom(t)  # no data: an external tensor holds only its entries
            info = {e.key: e.value for e in t.external_data}
            info["location"] = data_name
            info["offset"] = str(base[_location(t)] + int(info.get("offset") or 0))
            del moved.external_data[:]
            for key, value in info.items():
                e = moved.external_data.add()
                e.key, e.value = key, value
        _append_raw(out, staged, data_name)
        promote_model(staged, dest)


def _location(t: TensorProto) -> str:
    return next(e.value for e in t.external_data if e.key == "location")


def _append_raw(out: ModelProto, staged: Path, data_name: str, size_threshold: int = 1024) -> None:
    """Move ``out``'s in-memory initializers of at least ``size_threshold`` bytes to the end of the data file, then
    write the model file."""
    data = staged.with_name(data_name)
    pos = data.stat().st_size
    with open(data, "ab") as fh:
        for t in out.graph.initializer:
            if t.data_location == TensorProto.EXTERNAL or not t.HasField("raw_data"):
                continue
            stub = TensorProto()
            _copy_fields(t, stub, "raw_data")
            length = _raw_data_len(t)
            if length < size_threshold:
                continue
            gap = (-pos) % _ALIGN
            fh.write(b"\0" * gap)
            pos += gap
            fh.write(t.raw_data)
            t.ClearField("raw_data")
            for key, value in (("location", data_name), ("offset", str(pos)), ("length", str(length))):
                e = t.external_data.add()
                e.key, e.value = key, value
            t.data_location = TensorProto.EXTERNAL
            pos += length
    with open(staged, "wb") as fh:
        fh.write(out.SerializeToString())
