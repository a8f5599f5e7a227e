"""Prove two models compute the same outputs, bit for bit, on fresh random inputs (``trtforge fold --check``).

Which runtime judges: ``onnx.reference.ReferenceEvaluator`` when the model holds fp16/bf16/float8 tensors
(onnxruntime's CPU provider computes some fp16 ops in fp32 and rounds on its own, which would blur an exactness
check), onnxruntime's CPU provider otherwise (fast, and exact for fp32/integer graphs). Both models run on the same
inputs in the same runtime (the shared planner ``inputs.random_feeds``), compared by ``compare.compare_arrays``: NaN
equals NaN (payloads are not part of ONNX semantics); everything else must match bitwise, including the sign of
zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto

from ..core.graph import all_graphs, model_nodes
from .compare import compare_arrays
from .inputs import random_feeds
from .sessions import make_session

_LOW_PRECISION = {TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                  TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}


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
    for g in all_graphs(model.graph):
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.tensor_type.elem_type in _LOW_PRECISION:
                return True
        if any(t.data_type in _LOW_PRECISION for t in g.initializer):
            return True
    for n in model_nodes(model):
        for a in n.attribute:
            if (a.name == "to" and a.i in _LOW_PRECISION) or (a.HasField("t") and a.t.data_type in _LOW_PRECISION):
                return True
    return False


def run_model(model: ModelProto, feeds: Mapping[str, np.ndarray], runtime: str) -> list[np.ndarray]:
    """Every output of ``model`` on ``feeds``: ``onnx.reference``, or a deterministic onnxruntime session
    (``sessions.make_session``: no graph rewrites, no weight pre-packing, one thread)."""
    if runtime == "onnx.reference":
        from onnx.reference import ReferenceEvaluator

        return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, dict(feeds))]
    return [np.asarray(o) for o in make_session(model).run(None, dict(feeds))]


def check_equivalent(original: ModelProto, folded: ModelProto, seed: int = 0,
                     runtime: str | None = None, trials: int = 2) -> CheckResult:
    """Run both models on the same fresh random inputs (``trials`` draws) and compare every output bitwise."""
    if runtime is None:
        runtime = "onnx.reference" if uses_low_precision(original) or uses_low_precision(folded) else "onnxruntime"
    names = [o.name for o in original.graph.output]
    passed, worst, bad = True, 0.0, []
    for trial in range(trials):
        feeds = random_feeds(original, seed + trial)
        outs_a = run_model(original, feeds, runtime)
        outs_b = run_model(folded, feeds, runtime)
        for name, a, b in zip(names, outs_a, outs_b, strict=True):
            d = compare_arrays(a, b)
            ok, diff = d.bitwise, d.max_abs_unequal
            if not ok:
                passed = False
                bad.append(name)
            worst = max(worst, diff)
    return CheckResult(passed, worst, runtime, tuple(dict.fromkeys(bad)))


def first_mismatch(outs_a: Sequence[np.ndarray], outs_b: Sequence[np.ndarray]) -> int | None:
    for k, (a, b) in enumerate(zip(outs_a, outs_b, strict=True)):
        if not compare_arrays(a, b).bitwise:
            return k
    return None
