"""Safe ONNX loading (saving is ``onnx_save``).

``load_model`` refuses, with one line naming the file and the fix: a missing or empty file, bytes that are not an
ONNX model, a truncated model, external data that is missing, short, or whose location escapes the model's folder
(absolute path, ``..``, or a symlink pointing outside), and graphs with a dangling input or a cycle. Nothing outside
the model's folder is ever opened.

The checks run on the weight-free skeleton (``onnx_skeleton``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import GraphProto, ModelProto, TensorProto

from .errors import InputError, ModelError
from .graph import PROTO_LIMIT, nested_indices, stable_topo_order, subgraphs
from .onnx_skeleton import check_model
from .onnx_tensors import besides_initializers, fingerprint, model_tensors

# Above this size a model must be saved with external data (protobuf's hard limit is 2 GiB).
_EXTERNAL_THRESHOLD = PROTO_LIMIT
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
    # ``onnx_tensors.fingerprint`` of each tensor besides the main graph's initializers that was read from external
    # data: ``onnx_save.save_model(..., external_tensors=...)`` writes those to the output's data file again
    external_tensors: frozenset[tuple[int, bytes]] = frozenset()


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


def external_locations(model: ModelProto) -> list[str]:
    """The distinct external data ``location`` values of a model (relative to its folder), in first-use order."""
    locs: dict[str, None] = {}
    for tensor in model_tensors(model):
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
    for tensor in model_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        loc = info.get("location", "")
        where = f"{path}: initializer {tensor.name!r} has external data location {loc!r}"
        if not loc:
            raise ModelError(f"{where} which is empty; re-export the model with valid external data")
        if "\x00" in loc:  # os calls refuse it (ValueError: exit 3)
            raise ModelError(f"{where}, which holds a NUL character; re-export the model with valid external data")
        rel = Path(loc)
        if rel.is_absolute() or ".." in rel.parts:
            raise ModelError(
                f"{where} that escapes the model's folder; keep the data file beside the model and use a relative name"
            )
        target = (base / rel).resolve()
        if base not in target.parents:
            raise ModelError(f"{where} that resolves outside the model's folder; copy the data file beside the model")
        if target.exists() and not target.is_file():  # a FIFO would block the read, a folder cannot be read
            raise ModelError(f"{where}, which is not a regular file (a folder, FIFO or device); put the data file "
                             f"itself there as {rel}")
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
    """Refuse dangling inputs and cycles; sort nodes topologically in place if they are merely out of order.

    Each node's inputs and outputs are read once; subgraphs are looked for in the nodes that can carry them (control
    flow, custom domains: ``graph.may_have_subgraphs``; a graph attribute on any other op is refused by onnx's
    checker); an order that is already topological is recognised while the dependencies are read."""
    available: set[str] = set(outer) | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    available |= {t.values.name for t in graph.sparse_initializer}
    available.add("")  # optional inputs
    nodes = graph.node
    rows = [(n.input[:], n.output[:]) for n in nodes]
    producer: dict[str, int] = {}
    for idx, (_, outs) in enumerate(rows):
        for out in outs:
            if out:
                producer[out] = idx
    for k in nested_indices(graph):
        for sub in subgraphs(nodes[k]):
            check_graph_structure(sub, where, available | set(producer))
    ordered = True
    get = producer.get
    for idx, (ins, _) in enumerate(rows):
        for name in ins:
            j = get(name)
            if j is None:
                if name not in available:
                    node = nodes[idx]
                    raise ModelError(
                        f"{where}: node {node.name or node.op_type!r} reads {name!r}, which no node, input or "
                        "initializer produces (dangling input); fix the export or add the missing input")
            elif j >= idx:
                ordered = False
    if ordered:
        return  # every read is of an earlier node's output: acyclic and in order
    deps = [{producer[name] for name in ins if name in producer} for ins, _ in rows]
    order = stable_topo_order(deps)
    if len(order) != len(nodes):
        placed = set(order)
        stuck = next(nodes[i] for i in range(len(deps)) if i not in placed)
        raise ModelError(
            f"{where}: the graph has a cycle through node {stuck.name or stuck.op_type!r}; ONNX graphs must be "
            "acyclic, re-export the model"
        )
    if order != list(range(len(order))):
        # Acyclic but out of order: the stable order keeps the original one wherever it is already valid.
        sorted_nodes = [nodes[i] for i in order]
        del graph.node[:]
        graph.node.extend(sorted_nodes)


def _read_external(model: ModelProto, base: Path, lazy: bool) -> frozenset[tuple[int, bytes]]:
    """Read the model's external tensors into memory (with ``lazy``, main-graph initializers of at least
    ``lazy_weights.LAZY_MIN_BYTES`` stay on disk: the save copies those); returns the fingerprints of the other tensors
    read (subgraph and function tensors, Constant values, sparse initializers), which no save could copy."""
    from .lazy_weights import LAZY_MIN_BYTES, load_in_memory, load_small_external

    load_small_external(model.graph.initializer, base, min_bytes=LAZY_MIN_BYTES if lazy else 1 << 62)
    read = set()
    for t in besides_initializers(model):
        if t.data_location == TensorProto.EXTERNAL:
            load_in_memory(t, base)
            read.add(fingerprint(t))
    return frozenset(read)


def load_external_in_memory(model: ModelProto, base: Path) -> None:
    """Every external tensor of ``model`` (bodies and functions too) read into memory (``lazy_weights.load_in_memory``,
    not onnx's ``load_external_data_for_model``, which refuses a data file with several hard links)."""
    from .lazy_weights import load_in_memory

    for t in model_tensors(model):
        if t.data_location == TensorProto.EXTERNAL:
            load_in_memory(t, base)


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
    kept: frozenset[tuple[int, bytes]] = frozenset()
    if external:
        try:
            kept = _read_external(model, p.parent, lazy)
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
    return LoadedModel(model=model, path=p, external_data=external, data_files=data_files, external_tensors=kept)


def load_model(path: str | os.PathLike[str], *, check: bool = True) -> ModelProto:
    return load(path, check=check).model


def load_structure(path: str | os.PathLike[str]) -> LoadedModel:
    """The model at ``path`` with its external data left on disk (tensors keep their ``location``/``offset``
    entries; nothing is read): for commands that change the graph but not the weights (``lora inject``,
    ``lora decompose``, ``diff``'s planning). The external references are checked as ``load`` checks them (inside
    the model's folder, present, long enough) and the graph's structure (dangling inputs, cycles) is checked; onnx's
    checker is not run (it would need the weights). Save the result with ``onnx_save.save_with_source_data``."""
    from . import steps

    p = Path(path)
    with steps.step(f"load {p.name} (graph only)"):
        model = ModelProto()
        data = read_model_bytes(p)  # its own one-line errors (missing path, folder, empty file)
        try:
            model.ParseFromString(data)
        except Exception as exc:
            raise ModelError(f"{p}: not a valid ONNX model (protobuf parse failed: the file is truncated or not "
                             "ONNX); re-export it") from exc
        if not model.opset_import or not model.HasField("graph") or model.ir_version <= 0:
            raise ModelError(f"{p}: not an ONNX model (no graph, IR version or opset); pass an .onnx file")
        check_opset(model, p)
        data_files = _check_external(model, p)
        check_graph_structure(model.graph, str(p))
    return LoadedModel(model=model, path=p, external_data=bool(data_files), data_files=data_files)
