"""``onnx.reference`` as ``fold --check`` runs it: the stock evaluator with GatherElements held to its spec.

onnx.reference's GatherElements computes ``np.choose(indices, data, mode="wrap")``, and numpy wraps an index that
is out of range by adding or subtracting the axis length one step at a time, in C: an int64 index of -2**63 (a
value class the check feeds every integer input) is 2**62 steps on a table of 2, a loop that never ends and that
neither SIGINT nor SIGTERM interrupts (Python runs signal handlers between bytecodes only). The ONNX spec says an
index outside ``[-s, s - 1]`` is an error, and so does onnxruntime; here it raises ``IndexError`` before the stock
kernel runs, so the check skips that draw (the original rejects these values, as it does an out-of-range Gather
index) instead of hanging. In-range indices run the stock kernel unchanged, so every result it gives is the same.

Safety conditions: both models of a check run in this evaluator; subgraphs (If/Loop/Scan bodies) and model-local
functions are evaluated by ``self.__class__``, so they get the same kernel at any depth.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np


@lru_cache(maxsize=1)
def evaluator_class() -> Any:
    """The ``ReferenceEvaluator`` subclass (built on first use: onnx.reference is a heavy import)."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.ops.op_gather_elements import GatherElements as StockGatherElements

    class GatherElements(StockGatherElements):  # the class name is the op type onnx.reference looks up
        op_domain = ""

        def _run(self, data: Any, indices: Any, axis: Any = None) -> Any:
            k = 0 if axis is None else int(axis)
            data, indices = np.asarray(data), np.asarray(indices)
            if indices.size and data.ndim:
                n = data.shape[k % data.ndim]
                lo, hi = int(indices.min()), int(indices.max())
                if lo < -n or hi >= n:
                    raise IndexError(f"GatherElements: index {lo if lo < -n else hi} is out of range [-{n}, "
                                     f"{n - 1}] on axis {k}")
            return super()._run(data, indices, axis=axis)

    class CheckEvaluator(ReferenceEvaluator):  # type: ignore[misc]
        def __init__(self, proto: Any, **kwargs: Any) -> None:  # onnx.reference passes all but ``proto`` by name
            kwargs["new_ops"] = [*(kwargs.get("new_ops") or ()), GatherElements]
            super().__init__(proto, **kwargs)

    return CheckEvaluator
