"""Atomic ONNX saving (loading is ``onnx_io``).

``save_model`` stages in ``.trtforge-staging`` beside the output and renames, so a crash leaves no half-written model.
Models that came with external data (or are too big for one protobuf) are written with external data beside the
output, in ``<output name>.data`` (or ``<output name>.<hex>.data`` while that name is taken: the model file's rename
is the commit point, see ``model_commit``). ``save_with_source_data`` saves a model loaded by
``onnx_io.load_structure`` by copying its data file byte for byte; ``staged_model`` / ``promote_model`` let a model
be checked from its file before it replaces anything.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
from onnx import ModelProto, TensorProto

from .errors import InputError
from .onnx_io import _EXTERNAL_THRESHOLD, LoadedModel
from .onnx_skeleton import _copy_fields, _raw_data_len, without_initializers

_ALIGN = 4096  # data offsets aligned like onnx.save_model's, so onnxruntime can map the file


def _save_external(model: ModelProto, tmp_model: Path, data_name: str, size_threshold: int = 1024,
                   source_dir: Path | None = None,
                   external_tensors: frozenset[tuple[int, bytes]] = frozenset()) -> None:
    """Write ``model`` to ``tmp_model`` with each main-graph initializer of at least ``size_threshold`` bytes of
    ``raw_data`` in ``tmp_model``'s folder / ``data_name``, without copying the model: the weights are written one at
    a time (a transient copy of one tensor, which reading a protobuf bytes field makes) and the model file is the
    graph with data-free stand-ins pointing into the data file. ``model`` is not changed. Smaller and typed-field
    tensors stay in the model file, and so do the other tensors (subgraph initializers, Constant values, function and
    sparse tensors) unless they have at least ``size_threshold`` bytes and their ``onnx_tensors.fingerprint`` is in
    ``external_tensors`` (they came from external data: ``LoadedModel.external_tensors``). Tensors still on disk (a
    lazy load of a model in ``source_dir``) are copied byte for byte from their file."""
    out = without_initializers(model)
    pos = 0
    with open(tmp_model.parent / data_name, "wb") as fh:
        for t in model.graph.initializer:
            if t.data_location == TensorProto.EXTERNAL and source_dir is not None:
                from .lazy_weights import copy_tensor

                at, length = copy_tensor(t, source_dir, fh, pos, _ALIGN)
                stub = out.graph.initializer.add()
                _copy_fields(t, stub, "external_data")
                point_external(stub, data_name, at, length)
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
            point_external(stub, data_name, pos, length)
            out.graph.initializer.append(stub)
            pos += length
        if external_tensors:
            pos = _externalize_others(out, fh, pos, data_name, size_threshold, external_tensors)
    if pos == 0:
        (tmp_model.parent / data_name).unlink()  # nothing went out: no empty data file beside the model
    with open(tmp_model, "wb") as fh:
        fh.write(out.SerializeToString())


def _externalize_others(out: ModelProto, fh: Any, pos: int, data_name: str, size_threshold: int,
                        keep: frozenset[tuple[int, bytes]]) -> int:
    """Move the tensors of ``out`` besides its main-graph initializers whose bytes came from external data (``keep``)
    to ``fh`` at ``pos`` (aligned); returns the new end."""
    from .onnx_tensors import besides_initializers, fingerprint

    for t in besides_initializers(out):
        if (t.data_location == TensorProto.EXTERNAL or not t.HasField("raw_data")
                or _raw_data_len(t) < size_threshold or fingerprint(t) not in keep):
            continue
        pos = _move_raw(t, fh, pos, data_name)
    return pos


def _move_raw(t: TensorProto, fh: Any, pos: int, data_name: str) -> int:
    """Append ``t``'s ``raw_data`` to ``fh`` at the first aligned offset from ``pos`` and make ``t`` point there
    (``data_name``); returns the new end of the data file."""
    gap = (-pos) % _ALIGN
    fh.write(b"\0" * gap)
    pos += gap
    length = fh.write(t.raw_data)
    t.ClearField("raw_data")
    point_external(t, data_name, pos, length)
    return pos + length


def point_external(t: TensorProto, location: str, offset: int, length: int) -> None:
    """Make ``t`` (with no data of its own) name ``length`` bytes at ``offset`` of the file ``location``."""
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = key, value
    t.data_location = TensorProto.EXTERNAL


def save_model(model: ModelProto, path: str | os.PathLike[str], *, external_data: bool | None = None,
               source_dir: Path | None = None, external_tensors: frozenset[tuple[int, bytes]] = frozenset()) -> None:
    """``_save_model``, shown as the step "save"."""
    from . import steps

    with steps.step(f"save {Path(path).name}"):
        _save_model(model, path, external_data=external_data, source_dir=source_dir,
                    external_tensors=external_tensors)


def save_like(model: ModelProto, path: str | os.PathLike[str], source: LoadedModel) -> None:
    """``save_model`` with ``source``'s layout (the ``onnx_io.load`` result ``model`` was made from): external data
    when ``source`` had any, in any graph (If/Loop/Scan bodies and functions count), and each tensor besides the main
    graph's initializers that was external in ``source`` is external again (``external_tensors``)."""
    save_model(model, path, external_data=source.external_data or None, external_tensors=source.external_tensors)


def _save_model(model: ModelProto, path: str | os.PathLike[str], *, external_data: bool | None = None,
                source_dir: Path | None = None, external_tensors: frozenset[tuple[int, bytes]] = frozenset()) -> None:
    """Atomically save ``model`` to ``path``; external data goes to a data file beside it (``model_commit``).
    ``source_dir``: the folder of the model that a lazy ``load`` read, whose weights still on disk are copied into
    the output's data. ``external_tensors``: the input's ``LoadedModel.external_tensors``, so that its subgraph,
    attribute, function and sparse tensors that were external stay external (``_save_external``)."""
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
    staged_claims = _CLAIMS.get(dest)  # held until staged_model ends (promote_model commits it)
    with contextlib.ExitStack() as claims:
        data_name = ((staged_claims or claims).enter_context(model_commit.claim_data_name(final.parent, final.name))
                     if external_data else None)
        if staged_claims is not None:
            _write_model(model, dest, data_name, source_dir, external_tensors)
            return
        with staging.staging_dir(parent, dest.name) as entry:
            _write_model(model, entry / dest.name, data_name, source_dir, external_tensors)
            model_commit.commit_model(entry / dest.name, dest, data_name)


def _write_model(model: ModelProto, tmp_model: Path, data_name: str | None, source_dir: Path | None = None,
                 external_tensors: frozenset[tuple[int, bytes]] = frozenset()) -> None:
    if data_name is not None:
        _save_external(model, tmp_model, data_name, source_dir=source_dir, external_tensors=external_tensors)
    else:
        onnx.save_model(model, str(tmp_model))


# staged_model path -> the destination it will be promoted onto, and the data-name claims held until it ends
_STAGED_FOR: dict[Path, Path] = {}
_CLAIMS: dict[Path, contextlib.ExitStack] = {}


@contextlib.contextmanager
def staged_model(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path with ``dest``'s file name in a private staging folder beside ``dest`` (same filesystem),
    removed on exit. Save a model there (``save_model``), run it by path, then ``promote_model`` it onto ``dest``: so
    a model over 2 GiB can be checked from its file before it replaces anything at ``dest``."""
    from . import staging

    out = Path(dest)
    parent = out.parent if str(out.parent) else Path(".")
    with staging.staging_dir(parent, out.name) as entry, contextlib.ExitStack() as claims:
        staged = entry / out.name
        _STAGED_FOR[staged], _CLAIMS[staged] = out, claims
        try:
            yield staged
        finally:
            _STAGED_FOR.pop(staged, None)
            _CLAIMS.pop(staged, None)


def promote_model(staged: Path, dest: str | os.PathLike[str]) -> None:
    """Move a model saved by ``save_model`` at a ``staged_model`` path onto ``dest`` by renames (no copy); the
    model file's rename is the commit point (``model_commit``)."""
    from . import model_commit

    out = Path(dest)
    names = [n for n in os.listdir(staged.parent) if n != staged.name and n.endswith(".data")]
    model_commit.commit_model(staged, out, names[0] if names else None)


def _copy_range(src: Path, dst: Any) -> int:
    """Append file ``src`` to the open file ``dst`` (``direct_write.copy_span``); returns its size."""
    from .direct_write import copy_span

    size = src.stat().st_size
    copy_span(src, 0, size, dst)
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
    from .model_commit import claim_data_name
    from .onnx_tensors import besides_initializers, model_tensors

    with claim_data_name(parent, dest.name) as data_name, steps.step(f"save {dest.name} (copying the weights)"), \
            staged_model(dest) as staged:
        out = without_initializers(model)
        base: dict[str, int] = {}
        pos = 0
        with open(staged.with_name(data_name), "wb") as fh:
            for loc in dict.fromkeys(e.value for t in model_tensors(model) for e in t.external_data
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
            _relocate(moved, data_name, base)
        for t in besides_initializers(out):  # subgraph, attribute, function and sparse tensors (a copy: ``out``)
            if t.data_location == TensorProto.EXTERNAL:
                _relocate(t, data_name, base)
        _append_raw(out, staged, data_name)
        promote_model(staged, dest)


def _location(t: TensorProto) -> str:
    return next(e.value for e in t.external_data if e.key == "location")


def _relocate(t: TensorProto, data_name: str, base: dict[str, int]) -> None:
    """Point external tensor ``t`` into ``data_name``, where its file's bytes start at ``base[its location]``."""
    info = {e.key: e.value for e in t.external_data}
    info["offset"] = str(base[_location(t)] + int(info.get("offset") or 0))
    info["location"] = data_name
    del t.external_data[:]
    for key, value in info.items():
        e = t.external_data.add()
        e.key, e.value = key, value


def _append_raw(out: ModelProto, staged: Path, data_name: str, size_threshold: int = 1024) -> None:
    """Move ``out``'s in-memory initializers of at least ``size_threshold`` bytes to the end of the data file, then
    write the model file."""
    data = staged.with_name(data_name)
    pos = data.stat().st_size
    with open(data, "ab") as fh:
        for t in out.graph.initializer:
            if t.data_location == TensorProto.EXTERNAL or not t.HasField("raw_data"):
                continue
            if _raw_data_len(t) < size_threshold:
                continue
            pos = _move_raw(t, fh, pos, data_name)
    with open(staged, "wb") as fh:
        fh.write(out.SerializeToString())
