"""Random inputs for ``trtforge diff``: which dtype, shape and value range each graph input gets (pure planning).

Dynamic dims take small sizes (first dim 2, others 4; dims sharing a ``dim_param`` share the size, across both
models) unless ``shapes`` overrides them. Integer inputs are bounded so they are valid: indices of a ``Gather``
(through Cast/Reshape/Squeeze/Unsqueeze/Flatten/Identity) lie in ``[0, data.shape[axis])`` (token ids below the
vocabulary size of an embedding), and LoRA ``slot_ids`` lie in ``[-1, num_slots)``. Floats lie in ``[-1, 1]``.
``values`` pins an input to one constant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import InputError

_PASSTHROUGH = {"Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
_LORA_OP = "LoRAOpPluginDynamic"
_DEFAULT_INT_RANGE = (0, 7)


@dataclass(frozen=True)
class InputSpec:
    """How one graph input is generated: numpy dtype name, concrete shape, inclusive value range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    low: float
    high: float


def parse_value_args(items: Sequence[str]) -> dict[str, float]:
    """``["lora_slot_ids=-1"]`` -> ``{"lora_slot_ids": -1.0}`` (an input filled with one constant)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, text = item.partition("=")
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not sep or not name or not np.isfinite(value):
            raise InputError(f"--value {item!r}: expected NAME=NUMBER, e.g. lora_slot_ids=-1")
        out[name] = value
    return out


def parse_shape_args(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["input_ids:2,16", "mask:2x16"]`` -> ``{"input_ids": (2, 16), ...}``."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d < 0 for d in shape):
            raise InputError(f"--shape {item!r}: expected NAME:D0,D1,... with non-negative integers")
        out[name] = shape
    return out


def graph_inputs(model: Any) -> list[Any]:
    inits = {i.name for i in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def _static_shape(model: Any, name: str) -> tuple[int, ...] | None:
    for init in model.graph.initializer:
        if init.name == name:
            return tuple(init.dims)
    for vi in model.graph.input:
        if vi.name == name:
            dims = vi.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                return tuple(d.dim_value for d in dims)
    for node in model.graph.node:
        if node.op_type == "Constant" and name in node.output:
            for a in node.attribute:
                if a.name == "value":
                    return tuple(a.t.dims)
    return None


def _int_range(model: Any, name: str) -> tuple[int, int] | None:
    """Inclusive valid range for an integer input, from the ops that consume it (see module docstring)."""
    frontier, seen, best = [name], set(), None
    while frontier:
        value = frontier.pop()
        if value in seen:
            continue
        seen.add(value)
        for node in model.graph.node:
            if value not in node.input:
                continue
            if node.op_type in _PASSTHROUGH and node.input[0] == value:
                frontier.extend(node.output)
            elif node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == value:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                shape = _static_shape(model, node.input[0])
                if shape and shape[axis] > 0:
                    hi = shape[axis] - 1
                    best = (0, hi) if best is None else (0, min(best[1], hi))
            elif node.op_type == _LORA_OP and len(node.input) > 4 and node.input[4] == value:
                shape = _static_shape(model, node.input[2])  # lora_a [N, H, R]
                if shape:
                    best = (-1, shape[0] - 1) if best is None else (-1, min(best[1], shape[0] - 1))
    return best


def plan_inputs(models: Any, shapes: Mapping[str, tuple[int, ...]] | None = None,
                values: Mapping[str, float] | None = None) -> tuple[InputSpec, ...]:
    """Pure planning of the random inputs (dtypes, concrete shapes, value ranges) for one model or several
    (the union of their inputs; the first model that has an input decides its spec; a ``dim_param`` has one size
    across all). ``values`` pins an input to a constant (e.g. ``lora_slot_ids`` = -1: no adapter)."""
    from onnx import helper

    models = list(models) if isinstance(models, (list, tuple)) else [models]
    shapes, values = dict(shapes or {}), dict(values or {})
    names = {vi.name for m in models for vi in graph_inputs(m)}
    for what, given in (("--shape", shapes), ("--value", values)):
        unknown = sorted(set(given) - names)
        if unknown:
            raise InputError(f"{what} names {unknown} are not graph inputs (inputs: {sorted(names)})")
    by_param: dict[str, int] = {}
    specs: dict[str, InputSpec] = {}
    for model in models:
        for vi in graph_inputs(model):
            if vi.name in specs:
                continue
            tt = vi.type.tensor_type
            try:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name
            except (KeyError, TypeError) as exc:
                raise InputError(f"input {vi.name!r}: element type {tt.elem_type} is not supported by diff") from exc
            if vi.name in shapes:
                shape = shapes[vi.name]
                if len(shape) != len(tt.shape.dim):
                    raise InputError(f"--shape {vi.name}: rank {len(shape)} but the input has rank "
                                     f"{len(tt.shape.dim)}")
            else:
                dims = []
                for i, d in enumerate(tt.shape.dim):
                    if d.HasField("dim_value"):
                        dims.append(d.dim_value)
                    else:
                        size = 2 if i == 0 else 4
                        dims.append(by_param.setdefault(d.dim_param, size) if d.dim_param else size)
                shape = tuple(dims)
            if vi.name in values:
                low = high = values[vi.name]
            elif dtype == "bool":
                low, high = 0, 1
            elif np.issubdtype(np.dtype(dtype) if dtype != "bfloat16" else np.float32, np.integer):
                low, high = _int_range(model, vi.name) or _DEFAULT_INT_RANGE
            else:
                low, high = -1.0, 1.0
            specs[vi.name] = InputSpec(vi.name, dtype, shape, low, high)
    return tuple(specs.values())
