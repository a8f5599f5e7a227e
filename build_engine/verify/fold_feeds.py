"""Inputs for ``fold --check``: every value class of each dtype, and control flow that runs the bodies.

An exactness check is only as good as its inputs. Beside typical values (``inputs.random_feeds``: small
integers that index validly, normal floats), ``extreme_inputs`` fills every input with all the value classes its
dtype has, shuffled: for floats +-0.0, +-inf, NaN, the largest and smallest finite values, the smallest normal and
subnormal values of both signs, halves (rounding ties), values at a narrower float's precision edge
(``_PRECISION_EDGES``: a double rounding shows there) and wide-range random values; for integers the minimum, the
maximum, 0, +-1, the first integers float16/float32/float64 cannot hold and random values over the whole range (so
out-of-range narrowing and float conversions are hit);
for bool both values. ``control_pins`` finds graph inputs that decide control flow: a Loop's trip count and
condition are pinned so the body runs (trip count 3, condition true; Loops at any depth), and each If condition of
the main graph is tried both ways, so a body the fold changed is executed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper

from ..core.graph import all_graphs, free_names, subgraphs

_PASS = {"Identity", "Cast", "CastLike", "Squeeze", "Unsqueeze", "Reshape"}  # CastLike: its first input


#: Values at a narrower float's precision edge: a float16 rounding tie, the same tie plus 2**-40 (rounded to a tie by
#: a float64 -> float32 -> float16 path, not by one rounding: double rounding), a bfloat16 near-tie, float8 e4m3 and
#: e5m2 ties plus 2**-12 (a float16 or bfloat16 step on the way rounds them to the tie), and the first integers
#: float16, float32 and float64 cannot hold (a round trip through them, or a double rounding, shows here).
_PRECISION_EDGES = (1 + 2.0**-11, 1 + 2.0**-11 + 2.0**-40, -(1 + 2.0**-8 + 2.0**-30), 1 + 2.0**-4 + 2.0**-12,
                    -(1 + 2.0**-3 + 2.0**-12), 2.0**11 + 1, 2.0**24 + 1, -(2.0**24 + 3), 2.0**53 + 2)
_INT_EDGES = (2**8 + 1, 2**11 + 1, 2**24 + 1, -(2**24 + 1), 2**53 + 1, -(2**53 + 1))


def _float_classes(d: np.dtype) -> np.ndarray:
    # ml_dtypes' finfo answers for numpy's float types too; numpy's rejects every ml_dtypes type, float8_e5m2
    # included, although that one reports numpy kind "f"
    import ml_dtypes

    f = ml_dtypes.finfo(d)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 2.5, -1.5, float(f.max), float(f.min),
            float(f.tiny), -float(f.tiny), float(f.smallest_subnormal), -float(f.smallest_subnormal),
            65504.0, 65520.0, 2.0**31, -2.0**31 - 1, 2.0**32, 2.0**63, 1e-30, *_PRECISION_EDGES]
    with np.errstate(all="ignore"):
        return np.array(vals, np.float64).astype(d)


def _int_info(d: np.dtype) -> Any:
    """The integer limits of ``d``: numpy's ``iinfo``, or ml_dtypes' for its sub-byte integers (int4, uint4, int2,
    uint2: numpy kind ``V``, which ``np.iinfo`` rejects); None for a non-integer type."""
    if d.kind in "iu":
        return np.iinfo(d)
    import ml_dtypes

    try:
        return ml_dtypes.iinfo(d)
    except (ValueError, TypeError):
        return None


def _int_classes(d: np.dtype) -> np.ndarray:
    i = _int_info(d)
    vals = {int(i.min), int(i.max), 0, 1, int(i.max) - 1, 127, 128, 255, 256, 32767, 32768, 65535, 2**31 - 1, 2**31,
            *_INT_EDGES}
    if i.min < 0:
        vals |= {-1, int(i.min) + 1, -128, -129, -32769}
    carrier = np.int64 if i.max < 2**63 else object  # ml_dtypes' sub-byte ints convert from int64, not object
    return np.array(sorted(v for v in vals if i.min <= v <= i.max), dtype=carrier).astype(d)


def _fill(classes: np.ndarray, shape: list[int], rng: np.random.Generator, wide: np.ndarray,
          part: int) -> np.ndarray:
    """Every value of the pool (classes, then wide values), shuffled, when the tensor holds them all; else the
    ``part``-th window of the pool: parts 0, 1, ... together give a small tensor every class."""
    n = int(np.prod(shape)) if shape else 1
    pool = np.concatenate([classes, wide])
    if n >= len(pool):
        picked = pool[rng.permutation(n) % len(pool)]
    else:
        picked = pool[(part * n + rng.permutation(n)) % len(pool)]
    return picked.reshape(shape)


def _classes(t: int) -> np.ndarray | None:
    """The value classes of ONNX type ``t`` (None: bool, drawn as a coin; strings and complex: none)."""
    d = np.dtype(helper.tensor_dtype_to_np_dtype(t))
    if t == TensorProto.BOOL or t == TensorProto.STRING or d.kind in "cOUS":
        return None
    return _int_classes(d) if _int_info(d) is not None else _float_classes(d)


def value_class_parts(model: ModelProto, shapes: dict[str, list[int]]) -> int:
    """How many ``extreme_inputs`` parts give every input every value class of its dtype: 1 when each input holds
    them all, up to 23 for a scalar float."""
    parts = 1
    for vi in model.graph.input:
        classes = _classes(vi.type.tensor_type.elem_type) if vi.name in shapes else None
        n = int(np.prod(shapes[vi.name])) if vi.name in shapes else 0
        if classes is not None and n:
            parts = max(parts, -(-len(classes) // n))
    return parts


def extreme_inputs(model: ModelProto, shapes: dict[str, list[int]], seed: int, part: int = 0) -> dict[str, np.ndarray]:
    """Every value class of each input's dtype (see module doc), with the shapes of a typical feed; an input with
    fewer elements than classes gets window ``part`` of them (``value_class_parts``)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name not in shapes:
            continue
        t = vi.type.tensor_type.elem_type
        d = np.dtype(helper.tensor_dtype_to_np_dtype(t))
        shape = shapes[vi.name]
        if t == TensorProto.BOOL:
            feeds[vi.name] = rng.random(shape) < 0.5
        elif (i := _int_info(d)) is not None:
            wide = rng.integers(int(i.min), int(i.max), size=16, dtype=d if d.kind in "iu" else np.int64,
                                endpoint=True).astype(d)
            feeds[vi.name] = _fill(_int_classes(d), shape, rng, wide, part)
        elif t in (TensorProto.STRING,) or d.kind in "cOUS":
            continue
        else:
            with np.errstate(all="ignore"):
                wide = (rng.standard_normal(16) * 10.0 ** rng.integers(-8, 9, size=16)).astype(d)
            feeds[vi.name] = _fill(_float_classes(d), shape, rng, wide, part)
    return feeds


def inline_functions(model: ModelProto) -> ModelProto:
    """``model`` with its model-local functions inlined (a copy; ``model`` itself when it has none, or when onnx
    cannot inline them): what the control-flow questions read, since a function's Loop runs on its caller's
    values."""
    if not model.functions:
        return model
    import onnx.inliner

    with contextlib.suppress(Exception):
        return onnx.inliner.inline_local_functions(model)
    return model


_Scope = tuple[dict[str, NodeProto], set[str]]  # one graph's producers, and every name it defines


def _scope(graph: GraphProto) -> _Scope:
    producers = {o: n for n in graph.node for o in n.output}
    return producers, set(producers) | {i.name for i in graph.input} | {t.name for t in graph.initializer}


def _main_sources(scopes: list[_Scope], name: str) -> Iterator[str]:
    """The main-graph values that ``name``, read in the innermost of ``scopes`` (main graph first), is computed from
    through Identity/Cast/CastLike/(Un)Squeeze/Reshape (their first input), ``name`` included; each name resolved
    lexically (a body's own input or value shadows the main graph's)."""
    level, cur = len(scopes) - 1, name
    for _ in range(16):
        while level > 0 and cur not in scopes[level][1]:
            level -= 1
        if level == 0:
            yield cur
        p = scopes[level][0].get(cur)
        if p is None or p.op_type not in _PASS or not p.input:
            return
        cur = p.input[0]


def control_pins(model: ModelProto) -> tuple[dict[str, object], list[str]]:
    """({graph input: value that makes a Loop run its body}, [graph inputs that decide an If]).

    Loops at every depth (If/Loop/Scan bodies, model-local functions, seen inlined) are pinned: one nested in a
    branch whose trip count is a graph input would otherwise get that input's value classes (2**63 - 1 trips: the
    check never ends, or 0: the body never runs). Only the main graph's Ifs are tried both ways: one value for
    every condition would never run a nested If's else branch inside its parent's then branch, which random
    conditions do."""
    inputs = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    pins: dict[str, object] = {}
    branches: list[str] = []
    model = inline_functions(model)  # a Loop in a model-local function: its trip count is the caller's value

    def visit(graph: GraphProto, outer: list[_Scope]) -> None:
        scopes = [*outer, _scope(graph)]
        for n in graph.node:
            if n.op_type == "Loop":
                for k, value in ((0, 3), (1, True)):
                    if len(n.input) > k and n.input[k]:
                        pins.update((s, value) for s in _main_sources(scopes, n.input[k]) if s in inputs)
            elif n.op_type == "If" and n.input and not outer:
                branches.extend(s for s in _main_sources(scopes, n.input[0]) if s in inputs and s not in branches)
            for g in subgraphs(n):
                visit(g, scopes)

    visit(model.graph, [])
    return pins, branches


#: Inputs of ops whose values decide how big a tensor gets or how long a node runs (Range bounds, a ConstantOfShape/
#: Expand/Reshape shape, Tile repeats, Resize scales and sizes, Upsample scales, Pad pads, OneHot depth, TopK k, a
#: Loop's trip count, DFT/STFT lengths, window and mel-matrix sizes, Col2Im/MaxUnpool/AffineGrid output shapes).
_SIZE_INPUTS = {"Range": (0, 1, 2), "ConstantOfShape": (0,), "Expand": (1,), "Tile": (1,), "Reshape": (1,),
                "Resize": (2, 3), "Upsample": (1,), "Pad": (1,), "OneHot": (1,), "TopK": (1,), "CenterCropPad": (1,),
                "Loop": (0,), "DFT": (1,), "STFT": (1, 3), "HannWindow": (0,), "HammingWindow": (0,),
                "BlackmanWindow": (0,), "MelWeightMatrix": (0, 1), "Col2Im": (1, 2), "MaxUnpool": (2,),
                "AffineGrid": (1,)}
_VALUE_FREE = frozenset({"Shape", "Size"})  # their outputs do not depend on their input's values


def sizing_inputs(model: ModelProto) -> set[str]:
    """Graph inputs whose values decide how big a tensor gets (``_SIZE_INPUTS``, reached through any ops but
    Shape/Size, in any graph or function): a value class there (``Range(0, n)`` with n = 2**31 - 1) would allocate
    gigabytes per run (or run a Loop 2**31 - 1 times), so the check keeps their typical values in the value-class
    draws."""
    view = inline_functions(model)
    readers: dict[str, list[tuple[NodeProto, int]]] = {}
    for g in all_graphs(view.graph):
        for n in g.node:
            for k, i in enumerate(n.input):
                if i:
                    readers.setdefault(i, []).append((n, k))
            for sub in subgraphs(n):  # a body reading a value: the node's outputs depend on it
                for i in free_names(sub):
                    readers.setdefault(i, []).append((n, -1))
    out: set[str] = set()
    for vi in view.graph.input:
        seen, stack = set(), [vi.name]
        while stack and vi.name not in out:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            for n, k in readers.get(v, ()):
                if k in _SIZE_INPUTS.get(n.op_type, ()):
                    out.add(vi.name)
                elif n.op_type not in _VALUE_FREE:
                    stack.extend(o for o in n.output if o)
    return out


def sizing_typical(feeds: dict[str, np.ndarray], sizing: set[str]) -> dict[str, np.ndarray]:
    """``feeds`` with each float sizing input (a Resize/Upsample scale) set to 1.0 or 2.0: a typical normal draw is
    negative or zero half the time, which every runtime refuses as a scale, so the check had no verdict
    (onnxruntime's Upsample also refuses scales below 1, and ``onnx.reference``'s nearest Upsample fractional ones).
    An integer sizing input's 0 becomes 1: onnxruntime divides by an STFT ``frame_step`` without testing it for 0, a
    SIGFPE that killed the check (a fatal signal, no verdict), and a 0 size makes an empty tensor, nothing to
    compare."""
    out = dict(feeds)
    for name in sizing & feeds.keys():
        a = feeds[name]
        if a.dtype.kind in "iu":
            out[name] = np.where(a == 0, np.ones_like(a), a)
        elif a.dtype.kind != "b":  # float16/32/64 and ml_dtypes' bfloat16 / float8 carriers
            out[name] = np.floor(1.0 + np.abs(a.astype(np.float32)) % 2.0).astype(a.dtype)
    return out


def pinned(feeds: dict[str, np.ndarray], pins: dict[str, object], branch_inputs: list[str],
           branch_value: bool) -> dict[str, np.ndarray]:
    """``feeds`` with Loop inputs pinned and If conditions set to ``branch_value`` (cast to each input's dtype)."""
    out = dict(feeds)
    for name, value in [*pins.items(), *((b, branch_value) for b in branch_inputs)]:
        if name in out:
            out[name] = np.full(out[name].shape, value).astype(out[name].dtype)
    return out
