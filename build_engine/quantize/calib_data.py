"""Calibration samples: read from a user ``.npz`` (validated input by input) or generated from the model itself.

File format: one array per graph input, keyed by the input's name; an array of the input's rank is one sample, one
of rank + 1 stacks samples along a new leading axis (every array the same count). Each array must have the input's
dtype, its fixed dims (and one size per dim name across inputs), finite values, at least one element, and integer
values inside the range the graph accepts (token ids below the embedding table's size, LoRA slot ids in
``[-1, slots)``), so a bad file fails here, naming the input, instead of inside onnxruntime. A ``.npy`` (one unnamed
array) is refused with that advice. LoRA slot ids and adapter pools (fixed dims) may be left out: calibration runs
with slot ids -1 (and zero pools, which -1 never reads).

Generated samples come from the input planner that ``trtforge diff`` uses (``verify.inputs.plan_feeds``, drawn
with its ``draw``): token ids drawn inside the embedding table's range, shapes from dim names (first dim 1, other
dynamic dims ``seq_len``, one size per dim name, so positions and masks derived from the same ``sequence`` stay
consistent), LoRA slot ids pinned to -1 (the base model's activations: adapters change per request and are never
quantized).
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto

from trtforge.plugins.lora import spec as lora_spec

from ..core.errors import InputError
from ..verify.inputs import FeedSpec, graph_inputs, plan_feeds
from ..verify.inputs import _int_range as graph_int_range  # the planner's own reading of Gather bounds
from ..verify.inputs import draw as draw_one

Sample = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class CalibSet:
    """The samples and a one-line statement of where they came from (it goes into the report and manifest)."""

    samples: tuple[dict[str, np.ndarray], ...]
    source: str


def _slot_inputs(model: ModelProto) -> set[str]:
    return {n.input[lora_spec.SLOT_IDS] for n in model.graph.node
            if lora_spec.is_lora_node(n) and len(n.input) > lora_spec.SLOT_IDS}


def _pool_inputs(model: ModelProto) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
    """LoRA adapter pools and scales fed as graph inputs, with fixed dims: shape and dtype of each (their values are
    never read with slot ids -1, so a calibration file may leave them out)."""
    from onnx.helper import tensor_dtype_to_np_dtype

    names = {n.input[i] for n in model.graph.node if lora_spec.is_lora_node(n)
             for i in (lora_spec.LORA_A, lora_spec.LORA_B, lora_spec.SCALES) if len(n.input) > i}
    out = {}
    for vi in graph_inputs(model):
        dims = vi.type.tensor_type.shape.dim
        if vi.name in names and all(d.HasField("dim_value") for d in dims):
            out[vi.name] = (tuple(d.dim_value for d in dims), tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    return out


def _shapes(model: ModelProto, batch: int, seq_len: int) -> dict[str, tuple[int, ...]]:
    sizes: dict[str, int] = {}
    out: dict[str, tuple[int, ...]] = {}
    for vi in graph_inputs(model):
        dims = []
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            else:
                default = batch if i == 0 else seq_len
                dims.append(sizes.setdefault(d.dim_param, default) if d.dim_param else default)
        out[vi.name] = tuple(dims)
    return out


def plan(model: ModelProto, seq_len: int, batch: int = 1) -> tuple[FeedSpec, ...]:
    values = {name: -1.0 for name in _slot_inputs(model)}
    return plan_feeds(model, shapes=_shapes(model, batch, seq_len), values=values)


def draw(specs: tuple[FeedSpec, ...], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One sample from the specs (the planner's own drawing: integers uniform in the inclusive range, floats
    uniform). Each value is an array, a rank-0 input's too (a 0-d comparison gives a NumPy scalar, which onnxruntime
    refuses as a feed)."""
    return {s.name: np.asarray(draw_one(s, rng)) for s in specs}


def generate(model: ModelProto, count: int, seq_len: int, seed: int) -> CalibSet:
    specs = plan(model, seq_len)
    rng = np.random.default_rng(seed)
    samples = tuple(draw(specs, rng) for _ in range(count))
    shapes = ", ".join(f"{s.name} {list(s.shape)}" for s in specs)
    return CalibSet(samples, f"generated from the model: {count} samples, seed {seed} ({shapes})")


def load_npz(path: str | Path, model: ModelProto) -> CalibSet:
    """Read and validate a calibration file (see the module docstring)."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a .npy holds one unnamed array
            raise InputError(f"--calib {path}: a .npy file holds one unnamed array; save the samples as an .npz "
                             "with numpy.savez(path, input_name=array, ...), one array per graph input")
        with loaded as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InputError(f"--calib {path}: cannot read it as a NumPy .npz ({exc}); save samples with "
                         "numpy.savez(path, input_name=array, ...)") from exc
    inputs = {vi.name: vi for vi in graph_inputs(model)}
    if not arrays:
        raise InputError(f"--calib {path}: the file holds no arrays; it needs one per input: {sorted(inputs)}")
    unknown = sorted(set(arrays) - set(inputs))
    pools = _pool_inputs(model)
    missing = sorted(set(inputs) - set(arrays) - _slot_inputs(model) - set(pools))
    if unknown:
        raise InputError(f"--calib {path}: {unknown[0]!r} is not an input of the model (inputs: {sorted(inputs)})")
    if missing:
        raise InputError(f"--calib {path}: no array for input {missing[0]!r}; add it (inputs: {sorted(inputs)})")
    ranges = {s.name: s for s in plan(model, seq_len=1)}
    counts: dict[str, int] = {}
    for name, arr in arrays.items():
        arrays[name] = arr = _as_input_type(arr, ranges[name].dtype)
        bounded = graph_int_range(model, name) is not None  # only ranges the graph itself implies are enforced
        counts[name] = _check_array(path, inputs[name], arr, ranges[name], bounded)
    if len(set(counts.values())) > 1:
        raise InputError(f"--calib {path}: inputs hold different sample counts {counts}; stack the same number "
                         "of samples for every input")
    _check_named_dims(path, inputs, arrays)
    n = next(iter(counts.values()))
    samples = []
    for k in range(n):
        # np.asarray: sample k of a rank-0 input is a NumPy scalar, which onnxruntime refuses as a feed
        sample = {name: np.asarray(arr[k] if arr.ndim == len(inputs[name].type.tensor_type.shape.dim) + 1 else arr)
                  for name, arr in arrays.items()}
        for name in _slot_inputs(model) - set(arrays):  # no adapter during calibration
            sample[name] = np.full(_slot_shape(inputs[name], sample, inputs), lora_spec.NO_ADAPTER,
                                   lora_spec.SLOT_DTYPE)
        for name in set(pools) - set(arrays):  # unread with slot ids -1: zeros
            sample[name] = np.zeros(*pools[name])
        samples.append(sample)
    return CalibSet(tuple(samples), f"file {path}: {n} samples")


def _as_input_type(arr: np.ndarray, dtype: str) -> np.ndarray:
    """A bfloat16 / float8 array as the input's type: ``numpy.savez`` writes an ml_dtypes array as raw bytes (``|V2``,
    ``|V1``), so a sample file for a bfloat16 input never read back as bfloat16 and was refused."""
    if arr.dtype.kind != "V" or arr.dtype.names is not None or not ("float8" in dtype or dtype == "bfloat16"):
        return arr
    import ml_dtypes

    want = np.dtype(getattr(ml_dtypes, dtype))
    return arr.view(want) if want.itemsize == arr.dtype.itemsize else arr


def _check_named_dims(path: str | Path, inputs: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Dims that share a name (``batch``, ``sequence``) have one size in a sample: refused here, naming both
    inputs, instead of failing inside onnxruntime on the first sample."""
    seen: dict[str, tuple[int, str]] = {}
    for name in sorted(arrays):
        dims = inputs[name].type.tensor_type.shape.dim
        one = arrays[name].shape[-len(dims):] if dims else ()
        for i, d in enumerate(dims):
            if not d.dim_param:
                continue
            size, first = seen.setdefault(d.dim_param, (one[i], name))
            if size != one[i]:
                raise InputError(f"--calib {path}: input {name!r} has {one[i]} along dim {i} ({d.dim_param!r}) but "
                                 f"input {first!r} has {size}; the model takes one size for {d.dim_param!r}")


def _slot_shape(vi: object, sample: Mapping[str, np.ndarray], inputs: Mapping[str, Any]) -> tuple[int, ...]:
    """The slot ids' shape for ``sample``: each dim's fixed size, or the size the sample gives its dim name (inject
    names them after the projection input's dims); else the first array's leading dims. The first array alone gave
    ``[b, 4]`` for slot ids ``[b, s]`` when it was another input (a ``[b, 4, 8]`` cache), and calibration failed."""
    named: dict[str, int] = {}
    for name, arr in sample.items():
        dims = inputs[name].type.tensor_type.shape.dim if name in inputs else []
        for d, size in zip(dims, arr.shape, strict=False):
            if d.dim_param:
                named.setdefault(d.dim_param, int(size))
    first = next(iter(sample.values()))
    out = []
    for i, d in enumerate(vi.type.tensor_type.shape.dim):  # type: ignore[attr-defined]
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        elif d.dim_param in named:
            out.append(named[d.dim_param])
        else:
            out.append(int(first.shape[i]))
    return tuple(out)


def _check_array(path: str | Path, vi: object, arr: np.ndarray, spec: FeedSpec, bounded: bool) -> int:
    name = spec.name
    where = f"--calib {path}: input {name!r}"
    dims = vi.type.tensor_type.shape.dim  # type: ignore[attr-defined]
    if arr.size == 0:
        raise InputError(f"{where} is empty (shape {list(arr.shape)}); give at least one sample")
    if arr.dtype != np.dtype(spec.dtype):
        raise InputError(f"{where} has dtype {arr.dtype}; the model takes {spec.dtype}")
    if arr.ndim == len(dims):
        one, n = arr.shape, 1
    elif arr.ndim == len(dims) + 1:
        one, n = arr.shape[1:], arr.shape[0]
    else:
        raise InputError(f"{where} has rank {arr.ndim}; the model takes rank {len(dims)} (or {len(dims) + 1} with "
                         "samples stacked on a leading axis)")
    for i, d in enumerate(dims):
        if d.HasField("dim_value") and one[i] != d.dim_value:
            raise InputError(f"{where} has shape {list(one)} per sample; dim {i} must be {d.dim_value}")
    low = "float8" in spec.dtype or spec.dtype == "bfloat16"  # ml_dtypes: not numpy floating types
    if (np.issubdtype(arr.dtype, np.floating) or low) and not np.all(np.isfinite(arr.astype(np.float32))):
        raise InputError(f"{where} holds NaN or infinite values; calibration needs finite samples")
    if bounded and np.issubdtype(arr.dtype, np.integer):
        lo, hi = int(arr.min()), int(arr.max())
        if lo < spec.low or hi > spec.high:
            raise InputError(f"{where} holds values in [{lo}, {hi}]; the model accepts [{int(spec.low)}, "
                             f"{int(spec.high)}] (e.g. token ids below the vocabulary size)")
    return n
