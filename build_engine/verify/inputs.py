"""The one random-input planner, for ``trtforge fold --check`` (``bitwise``) and ``trtforge diff`` (``diff``).

Planning (``plan_feeds``, pure): which dtype, shape and value range each graph input gets. Dynamic dims take small
sizes (first dim 2, others 4; dims sharing a ``dim_param`` share the size, across all models planned together)
unless ``shapes`` overrides them. Integer inputs are bounded so they are valid: indices of a ``Gather`` or
``GatherElements`` (through Cast/CastLike/Reshape/Squeeze/Unsqueeze/Flatten/Identity, as their first input) lie in
``[0, data.shape[axis])`` (token ids below the vocabulary size of an embedding, its table read directly or through a
Cast/CastLike/Identity: ``Gather(Cast(w_fp16), ids)``), and LoRA ``slot_ids`` lie in ``[-1, num_slots)``; other
integers lie in ``[0, 7]``, and below the smallest embedding table's size when the model has one. Floats lie in
``[-1, 1]``. ``values`` pins an input to one constant.

Drawing (``draw``, one function for every dtype): values of a ``FeedSpec`` from a seeded NumPy generator. ``fold
--check`` draws with it; ``diff`` hands the same plan to Polygraphy's seeded ``DataLoader``, so its inputs are the
ones ``polygraphy run`` would generate for that seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtforge.plugins import is_plugin_node
from trtforge.plugins.lora import spec as lora_spec

from ..core.errors import InputError
from ..core.graph import tensor_dims

_PASSTHROUGH = {"Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
_DEFAULT_INT_RANGE = (0, 7)


@dataclass(frozen=True)
class FeedSpec:
    """How one graph input's random feed is generated: numpy dtype name, concrete shape, inclusive value range."""

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


#: Elements of one generated input (--shape): 2**28 float32 values are 1 GiB, and each runner holds a copy.
MAX_SHAPE_ELEMENTS = 2**28


def parse_shape_args(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["input_ids:2,16", "mask:2x16"]`` -> ``{"input_ids": (2, 16), ...}``."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d < 1 for d in shape):
            # 0 would make an empty tensor: a comparison of no values, which passes whatever the models compute
            raise InputError(f"--shape {item!r}: expected NAME:D0,D1,... with positive integers")
        if math.prod(shape) > MAX_SHAPE_ELEMENTS:
            raise InputError(f"--shape {item!r}: {math.prod(shape)} elements, above the limit of "
                             f"{MAX_SHAPE_ELEMENTS} per input; give a smaller shape")
        out[name] = shape
    return out


def graph_inputs(model: Any) -> list[Any]:
    inits = {i.name for i in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


# ops whose output has their first input's shape: a table behind them (``Gather(Cast(w_fp16), ids)``) has its rows
_SAME_SHAPE = {"Cast", "CastLike", "Identity"}


def _static_shape(model: Any, name: str) -> tuple[int, ...] | None:
    """The static shape of main-graph value ``name``: an initializer, a fully static graph input, a Constant, or
    one of those behind Cast / CastLike / Identity nodes (at most 16)."""
    from ..passes.protos import constant_node_tensor

    for _ in range(17):
        for init in model.graph.initializer:
            if init.name == name:
                return tuple(init.dims)
        for vi in model.graph.input:
            if vi.name == name:
                dims = vi.type.tensor_type.shape.dim
                return tuple(d.dim_value for d in dims) if all(d.HasField("dim_value") for d in dims) else None
        node = next((n for n in model.graph.node if name in n.output), None)
        if node is not None and node.op_type == "Constant":  # value, value_int(s), value_float(s)
            t = constant_node_tensor(node)
            return None if t is None else tuple(t.dims)
        if node is None or node.op_type not in _SAME_SHAPE or not node.input or not node.input[0]:
            return None
        name = node.input[0]
    return None


# The input index of each sequence op's position, valid in [-n, n - 1] for a sequence of n (SequenceInsert: [-n, n])
_SEQUENCE_POSITION = {"SequenceAt": 1, "SequenceErase": 1, "SequenceInsert": 2}


def _sequence_length(model: Any, name: str) -> int | None:
    """The length of the sequence ``name`` when the main graph builds it with SequenceConstruct, else None."""
    for node in model.graph.node:
        if node.op_type == "SequenceConstruct" and name in node.output:
            return len(node.input)
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
            elif node.op_type in ("Gather", "GatherElements") and len(node.input) > 1 and node.input[1] == value:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                shape = _static_shape(model, node.input[0])
                if shape and shape[axis] > 0:
                    hi = shape[axis] - 1
                    best = (0, hi) if best is None else (0, min(best[1], hi))
            elif node.op_type in _SEQUENCE_POSITION and node.input[_SEQUENCE_POSITION[node.op_type]:][:1] == [value]:
                n = _sequence_length(model, node.input[0])
                if n:  # SequenceInsert may also append (position n)
                    hi = n if node.op_type == "SequenceInsert" else n - 1
                    best = (-n, hi) if best is None else (max(best[0], -n), min(best[1], hi))
            elif (is_plugin_node(node) and len(node.input) > lora_spec.SLOT_IDS
                  and node.input[lora_spec.SLOT_IDS] == value):
                shape = _static_shape(model, node.input[lora_spec.LORA_A])  # lora_a [N, H, R]
                if shape:
                    best = (-1, shape[0] - 1) if best is None else (-1, min(best[1], shape[0] - 1))
    return best


def _default_int_range(model: Any) -> tuple[int, int]:
    """``[0, 7]``, capped below the smallest embedding table (a Gather whose data is an initializer): an integer
    input that reaches an embedding through ops the trace does not follow still indexes it validly."""
    inits = {t.name: t for t in model.graph.initializer}
    sizes = [int(inits[n.input[0]].dims[0]) for n in model.graph.node
             if n.op_type == "Gather" and n.input[0] in inits and inits[n.input[0]].dims]
    low, high = _DEFAULT_INT_RANGE
    return (low, min(high, min(sizes) - 1)) if sizes and min(sizes) > 0 else (low, high)


def plan_feeds(models: Any, shapes: Mapping[str, tuple[int, ...]] | None = None,
               values: Mapping[str, float] | None = None) -> tuple[FeedSpec, ...]:
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
    by_param = _params_from_shapes(models, shapes)  # --shape ids:3,7 sizes every other 'batch'/'sequence' too
    specs: dict[str, FeedSpec] = {}
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
                _check_static_dims(vi.name, tt.shape.dim, shape)
            else:
                dims = []
                for i, d in enumerate(tt.shape.dim):
                    if d.HasField("dim_value"):
                        dims.append(d.dim_value)
                    else:
                        size = 2 if i == 0 else 4
                        if d.dim_param == lora_spec.TOKENS_DIM and len(tt.shape.dim) == 1:
                            size = _token_count(by_param)
                        dims.append(by_param.setdefault(d.dim_param, size) if d.dim_param else size)
                shape = tuple(dims)
            if vi.name in values:
                low = high = _check_value(vi.name, dtype, values[vi.name])
                _check_index_value(model, vi.name, dtype, low)
            elif dtype == "bool":
                low, high = 0, 1
            elif np.issubdtype(np.dtype(dtype) if dtype != "bfloat16" else np.float32, np.integer):
                low, high = _int_range(model, vi.name) or _default_int_range(model)
            else:
                low, high = -1.0, 1.0
            specs[vi.name] = FeedSpec(vi.name, dtype, shape, low, high)
    return tuple(specs.values())


def _check_index_value(model: Any, name: str, dtype: str, value: float) -> None:
    """An integer ``--value`` above the rows of what it indexes (a Gather's table, a LoRA slot pool of N slots): the
    run failed in onnxruntime's Gather, named as the deleted temporary decomposed model, with a hint at --shape."""
    if dtype == "bool" or not np.issubdtype(np.dtype(dtype) if dtype != "bfloat16" else np.float32, np.integer):
        return
    bounds = _int_range(model, name)
    if bounds is not None and value > bounds[1]:
        what = (f"picks one of the {bounds[1] + 1} slots of a LoRA adapter pool: give -1 (no adapter) to {bounds[1]}"
                if bounds[0] == -1 else f"indexes a table of {bounds[1] + 1} rows (Gather): give 0 to {bounds[1]}")
        raise InputError(f"--value {name}={value:g}: {name} {what}")


def _check_value(name: str, dtype: str, value: float) -> float:
    """A ``--value`` the input's dtype holds exactly: Polygraphy's DataLoader truncated 2.7 to 2 for an integer input,
    rounded 70000 to inf for a float16 one, and failed a uint8 input at -3 with a message naming onnxruntime."""
    if dtype == "bool":
        ok, holds = value in (0.0, 1.0), "0 or 1"
    elif np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(np.dtype(dtype))
        ok, holds = value.is_integer() and info.min <= value <= info.max, f"whole numbers from {info.min} to {info.max}"
    else:
        import ml_dtypes  # its finfo knows bfloat16 / float8 too (onnx's own carriers)

        top = float(ml_dtypes.finfo(_np_dtype(dtype)).max)
        ok, holds = abs(value) <= top, f"finite numbers up to {top:g} in magnitude"
    if not ok:
        raise InputError(f"--value {name}={value:g}: input {name!r} is {dtype}, which holds {holds}; give such a value")
    return value


def _check_static_dims(name: str, dims: Any, shape: tuple[int, ...]) -> None:
    """A ``--shape`` must keep the input's static sizes: Polygraphy's DataLoader drops a shape that contradicts one
    (and then feeds 1 for every dynamic dim), so the comparison would run, and report, other inputs than asked."""
    for i, (d, size) in enumerate(zip(dims, shape, strict=True)):
        if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != size:
            model_shape = ",".join(str(x.dim_value) if x.HasField("dim_value") else (x.dim_param or "?")
                                   for x in dims)
            raise InputError(f"--shape {name}:{','.join(map(str, shape))}: dimension {i} of input {name!r} is "
                             f"fixed at {d.dim_value} in the model (shape {model_shape}); give {d.dim_value} there "
                             "and choose sizes only for the dynamic dimensions")


def _token_count(by_param: Mapping[str, int]) -> int:
    """``lora_tokens`` (``lora inject``'s name for a 2-D projection input's token count): batch x sequence as the
    other inputs got them, as the build sizes it (a size of 2, the first-dim default, failed the decomposed model's
    MatMul against the 2 x 4 tokens of a [batch, sequence, H] input)."""
    from ..engine.shapes import BATCH_NAMES, SEQUENCE_NAMES

    batch = next((v for k, v in by_param.items() if k.strip().lower() in BATCH_NAMES), 2)
    sequence = next((v for k, v in by_param.items() if k.strip().lower() in SEQUENCE_NAMES), 4)
    return batch * sequence


def _params_from_shapes(models: list[Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The sizes ``--shape`` gives to named dims (``dim_param``), so that the inputs it does not name but that share
    those dims get the same sizes (they got the defaults, and the models failed to broadcast)."""
    out: dict[str, int] = {}
    for model in models:
        for vi in graph_inputs(model):
            dims = vi.type.tensor_type.shape.dim
            if vi.name in shapes and len(shapes[vi.name]) == len(dims):
                for d, size in zip(dims, shapes[vi.name], strict=True):
                    if d.dim_param and not d.HasField("dim_value"):
                        out.setdefault(d.dim_param, int(size))
    return out


def draw(spec: FeedSpec, rng: np.random.Generator) -> np.ndarray:
    """Random values for one planned input: the one place where a dtype decides how values are drawn.

    bool: fair coin; integers: uniform over the inclusive range; floats (bfloat16 via ml_dtypes): uniform over the
    range, drawn in float32 and rounded once to the dtype. A pinned input (``low == high``) is that constant.
    """
    dtype = _np_dtype(spec.dtype)
    if spec.low == spec.high:
        return np.full(spec.shape, spec.low).astype(dtype)
    if dtype == np.bool_:
        return rng.random(spec.shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(spec.low), int(spec.high) + 1, size=spec.shape).astype(dtype)
    return rng.uniform(spec.low, spec.high, size=spec.shape).astype(np.float32).astype(dtype)


def draw_feeds(specs: Sequence[FeedSpec], seed: int) -> dict[str, np.ndarray]:
    """One feed dict for ``specs`` from ``numpy.random.default_rng(seed)`` (drawn in plan order)."""
    rng = np.random.default_rng(seed)
    return {s.name: np.asarray(draw(s, rng)) for s in specs}


def random_feeds(model: Any, seed: int) -> dict[str, np.ndarray]:
    """``draw_feeds(plan_feeds(model), seed)``: the inputs ``fold --check`` runs a model on."""
    return draw_feeds(plan_feeds(model), seed)


def _np_dtype(name: str) -> np.dtype[Any]:
    """numpy dtype of a planned name; bfloat16 and float8 types come from ml_dtypes (onnx's own carriers)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def check_same_input_dims(ma: Any, mb: Any, pa: object, pb: object) -> None:
    """An input both models have gets one tensor: refuse ranks or static sizes that differ (both runs would not
    take the same feed; it was reported as outputs differing by inf)."""
    dims_b = {vi.name: tensor_dims(vi) for vi in graph_inputs(mb)}
    for vi in graph_inputs(ma):
        da, db = tensor_dims(vi), dims_b.get(vi.name)
        if da is None or db is None:
            continue
        if len(da) != len(db) or any(isinstance(x, int) and isinstance(y, int) and x > 0 and y > 0 and x != y
                                     for x, y in zip(da, db, strict=False)):
            raise InputError(f"{pa} and {pb} differ in input {vi.name!r}: dims {list(da)} vs {list(db)}; diff feeds "
                             "both models the same tensor: compare models with the same input shapes")


def check_tensor_outputs(model: Any, path: object) -> None:
    """Refuse an output that is a sequence, map or optional: Polygraphy's comparator takes tensors only (it failed as
    'running ... failed: dtype is unsupported for objects of type: list', blaming the model); and a string tensor:
    the comparator subtracts the two outputs (it failed with an internal TypeError, exit 3)."""
    from onnx import TensorProto

    for vi in model.graph.output:
        kind = vi.type.WhichOneof("value")
        if kind not in (None, "tensor_type", "sparse_tensor_type"):
            what = kind.removesuffix("_type")
            raise InputError(f"{path}: output {vi.name!r} is {'an' if what[0] in 'aeiou' else 'a'} {what}; diff "
                             "compares tensor outputs only (Polygraphy), so compare a variant returning its elements "
                             "as tensors, or check a rewrite with 'trtforge fold --check'")
        if kind == "tensor_type" and vi.type.tensor_type.elem_type == TensorProto.STRING:
            raise InputError(f"{path}: output {vi.name!r} is a string tensor; Polygraphy's comparator computes "
                             "differences, which strings have none of: compare a variant without it, or check a "
                             "rewrite with 'trtforge fold --check'")


def run_failure_hint(text: str) -> str:
    """What to do when onnxruntime (under Polygraphy) failed to run a model with the error ``text``."""
    if "NOT_IMPLEMENTED" in text:
        return ("onnxruntime's CPU provider lacks a kernel for this op and type (it has no bf16 MatMul): compare the "
                "fp32 or fp16 variant, or an engine on a GPU")
    if "No corresponding Numpy type" in text:
        return ("onnxruntime's Python API cannot return an output of this type (bfloat16, int4, uint4, float4): "
                "compare a variant that casts such outputs to float32 (or int8), or an engine on a GPU")
    return "check the models run in onnxruntime and pass --shape for inputs whose size matters"
