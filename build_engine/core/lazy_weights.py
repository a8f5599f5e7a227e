"""Weights left on disk: a model loaded with ``onnx_io.load(..., lazy=True)`` keeps each big external tensor as its
external-data entries (location, offset, length, relative to the source model's folder) instead of its bytes.

Why: reading a weight into a protobuf message costs the weight twice for a moment (the bytes read, then the copy the
message keeps), and every later read of ``raw_data`` hands out one more copy. Commands that change the graph but
not (most of) the weights then peak near the weights' size plus the largest tensor, about 1.5x; with the weights on
disk they peak at the graph's size. Code that needs a lazy weight's values reads it here, in chunks
(``read_chunks``: plain reads, no memory map, so the pages read are not counted as the process's resident memory),
and ``onnx_save.save_model(..., source_dir=...)`` copies each one byte for byte (``copy_file_range``) into the
output's data file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
from onnx import ModelProto, TensorProto

from .direct_write import copy_span

# External tensors smaller than this are read into memory by a lazy load: shape inference and folding read small
# constants' values (Reshape targets, Slice bounds, Casts of constants), and their bytes cost nothing.
LAZY_MIN_BYTES = 1 << 20


def entries(tensor: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def on_disk(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def span(tensor: TensorProto, base_dir: Path) -> tuple[Path, int, int]:
    """(file, offset, length) of an external tensor's bytes (``load`` has checked them against the file). An absolute
    ``location`` (``load`` refuses one in a model file) is a temporary file of this process: ``quantize.stored.spill``
    points the weights it writes there, so they are read and copied as a lazy load's are."""
    info = entries(tensor)
    path = base_dir / info["location"]
    offset = int(info.get("offset") or 0)
    length = int(info["length"]) if info.get("length") else path.stat().st_size - offset
    return path, offset, length


def load_small_external(tensors: Iterable[TensorProto], base_dir: Path, min_bytes: int = LAZY_MIN_BYTES) -> int:
    """Read the external ones of ``tensors`` (a model's) under ``min_bytes`` into memory (as onnx's loader does);
    returns how many bytes stay on disk. (This module does not import ``onnx_io``, which imports it.)"""
    left = 0
    for t in tensors:
        if not on_disk(t):
            continue
        _, _, length = span(t, base_dir)
        if length >= min_bytes:
            left += length
            continue
        load_in_memory(t, base_dir)
    return left


def load_in_memory(tensor: TensorProto, base_dir: Path) -> None:
    """Read an external tensor's bytes into ``raw_data`` (as onnx's ``load_external_data_for_tensor`` does), by
    trtforge's own reader: ``onnx_io.load`` has checked the location (a regular file inside the model's folder) and
    the bounds, and onnx's reader also refuses a data file with more than one hard link ("potential hardlink
    attack": a ``cp -al`` copy, a deduplicating store), which the big weights left on disk were read from all along:
    the same model then loaded when its weights were big and was refused (or, for ``fold --check``, crashed) when
    they were small."""
    path, offset, length = span(tensor, base_dir)
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read(length)
    if len(data) != length:
        raise ValueError(f"{path}: {len(data)} bytes at offset {offset}, {length} expected (the file is truncated)")
    tensor.raw_data = data
    tensor.data_location = TensorProto.DEFAULT
    del tensor.external_data[:]


def has_lazy(model: ModelProto) -> bool:
    return any(on_disk(t) for t in model.graph.initializer)


def read_chunks(tensor: TensorProto, base_dir: Path, dtype: str | np.dtype[Any], chunk: int) -> Iterator[np.ndarray]:
    """The tensor's elements as ``dtype`` (little-endian numpy dtype string), ``chunk`` elements at a time."""
    path, offset, length = span(tensor, base_dir)
    item = np.dtype(dtype).itemsize
    total = length // item
    with open(path, "rb") as fh:
        fh.seek(offset)
        for start in range(0, total, chunk):
            n = min(chunk, total - start)
            part = np.fromfile(fh, dtype=dtype, count=n)
            if part.size != n:
                raise OSError(f"{path}: short read at element {start} of {tensor.name!r}")
            yield part


def copy_tensor(tensor: TensorProto, base_dir: Path, dst: BinaryIO, pos: int, align: int) -> tuple[int, int]:
    """Copy a lazy tensor's bytes to ``dst`` at ``pos`` rounded up to ``align``; returns (offset written at,
    length)."""
    path, offset, length = span(tensor, base_dir)
    gap = (-pos) % align
    dst.write(b"\0" * gap)
    copy_span(path, offset, length, dst)
    return pos + gap, length


def to_array(tensor: TensorProto, base_dir: Path | None) -> np.ndarray:
    """The tensor's values as numpy, read from its file when it is still on disk (a lazy load of a model in
    ``base_dir``): one tensor at a time, so code that needs a few weights' values never holds the others."""
    if not on_disk(tensor) or base_dir is None:
        return onnx.numpy_helper.to_array(tensor)
    np_type = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    count = max(1, span(tensor, base_dir)[2] // np_type.itemsize)
    parts = list(read_chunks(tensor, base_dir, np_type.newbyteorder("<"), count))  # one chunk: the whole tensor
    flat = parts[0] if parts else np.empty(0, np_type)
    return flat.astype(np_type, copy=False).reshape(tuple(tensor.dims))
