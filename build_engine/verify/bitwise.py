"""Prove two models compute the same outputs, bit for bit, on fresh random inputs (``trtforge fold --check``).

Which runtime judges: ``onnx.reference.ReferenceEvaluator`` when the model holds fp16/bf16/float8 tensors
(onnxruntime's CPU provider computes some fp16 ops in fp32 and rounds on its own, which would blur an exactness
check), onnxruntime's CPU provider otherwise (fast, and exact for fp32/integer graphs). Both models run on the same
inputs in the same runtime. NaN equals NaN (payloads are not part of ONNX semantics); everything else must match
bitwise, including the sign of zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper

from ..passes.ir import all_graphs, subgraphs

_LOW_PRECISION = {TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                  TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}
_SMALL_DIM = 3


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    max_abs_diff: float
    runtime: str
    mismatched: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "max_abs_diff": self.max_abs_diff, "runtime": self.runtime,
                "mismatched_outputs": list(self.mismatched)}


def uses_low_precision(model: ModelProto) -> bool:
    """Whether any tensor of the model (value, initializer, Cast target) is fp16, bf16 or float8, in the main
    graph, its subgraphs or a model-local function body."""
    graphs = list(all_graphs(model.graph))
    nodes = [n for g in graphs for n in g.node]
    for fn in model.functions:
        nodes += fn.node
        nodes += [n for top in fn.node for sub in subgraphs(top) for g in all_graphs(sub) for n in g.node]
    for g in graphs:
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.tensor_type.elem_type in _LOW_PRECISION:
                return True
        if any(t.data_type in _LOW_PRECISION for t in g.initializer):
            return True
    for n in nodes:
        for a in n.attribute:
            if (a.name == "to" and a.i in _LOW_PRECISION) or (a.HasField("t") and a.t.data_type in _LOW_PRECISION):
                return True
    return False


def _vocab(model: ModelProto) -> int | None:
    """Smallest first dimension of a Gather whose data is an initializer (an embedding table): a valid id range."""
    inits = {t.name: t for t in model.graph.initializer}
    sizes = [inits[n.input[0]].dims[0] for n in model.graph.node
             if n.op_type == "Gather" and n.input[0] in inits and inits[n.input[0]].dims]
    return min(sizes) if sizes else None


def random_inputs(model: ModelProto, seed: int = 0, dim_size: int = _SMALL_DIM) -> dict[str, np.ndarray]:
    """Fresh random feeds: dynamic dims become small sizes (one size per dim name), ints stay in a valid range."""
    rng = np.random.default_rng(seed)
    init_names = {t.name for t in model.graph.initializer}
    vocab = _vocab(model)
    named: dict[str, int] = {}
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                shape.append(named.setdefault(d.dim_param or f"?{len(named)}", dim_size + len(named) % 2))
        np_type = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if tt.elem_type == TensorProto.BOOL:
            arr = rng.random(shape) < 0.5
        elif np.issubdtype(np_type, np.integer):
            high = vocab if vocab else 4
            arr = rng.integers(0, high, size=shape).astype(np_type)
        else:
            arr = rng.standard_normal(shape).astype(np.float32).astype(np_type)
        feeds[vi.name] = np.asarray(arr)
    return feeds


def run_model(model: ModelProto, feeds: Mapping[str, np.ndarray], runtime: str) -> list[np.ndarray]:
    if runtime == "onnx.reference":
        from onnx.reference import ReferenceEvaluator

        return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, dict(feeds))]
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Constant weights are pre-packed by MatMul kernels (another summation order) while a weight behind an Identity
    # is not: without this, removing `Identity(weight)` would look like a numeric change. One thread: no
    # scheduling-dependent reductions.
    opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, dict(feeds))]


def _as_bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a


def compare(a: np.ndarray, b: np.ndarray) -> tuple[bool, float]:
    """(bitwise equal with NaN == NaN, max |a - b| over the finite differing elements; inf if types/shapes differ)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False, float("inf")
    if a.dtype.kind in "OUS":
        return bool(np.array_equal(a, b)), 0.0
    same = _as_bits(a) == _as_bits(b)
    if a.dtype.kind == "f" or a.dtype.kind == "V" or "float" in a.dtype.name:
        fa, fb = a.astype(np.float64), b.astype(np.float64)
        same |= np.isnan(fa) & np.isnan(fb)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.nan_to_num(np.where(same, 0.0, np.abs(fa - fb)), nan=np.inf)  # NaN vs number: inf
    else:
        diff = np.where(same, 0, np.abs(a.astype(np.float64) - b.astype(np.float64)))
    ok = bool(np.all(same))  # -0.0 vs 0.0 differs with a difference of 0
    return ok, float(diff.max()) if diff.size else 0.0


def check_equivalent(original: ModelProto, folded: ModelProto, seed: int = 0,
                     runtime: str | None = None, trials: int = 2) -> CheckResult:
    """Run both models on the same fresh random inputs (``trials`` draws) and compare every output bitwise."""
    if runtime is None:
        runtime = "onnx.reference" if uses_low_precision(original) or uses_low_precision(folded) else "onnxruntime"
    names = [o.name for o in original.graph.output]
    passed, worst, bad = True, 0.0, []
    for trial in range(trials):
        feeds = random_inputs(original, seed + trial)
        outs_a = run_model(original, feeds, runtime)
        outs_b = run_model(folded, feeds, runtime)
        for name, a, b in zip(names, outs_a, outs_b, strict=True):
            ok, diff = compare(a, b)
            if not ok:
                passed = False
                bad.append(name)
            worst = max(worst, diff)
    return CheckResult(passed, worst, runtime, tuple(dict.fromkeys(bad)))


def first_mismatch(outs_a: Sequence[np.ndarray], outs_b: Sequence[np.ndarray]) -> int | None:
    for k, (a, b) in enumerate(zip(outs_a, outs_b, strict=True)):
        if not compare(a, b)[0]:
            return k
    return None
