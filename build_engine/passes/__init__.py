"""Exact ONNX graph passes: Cast/Identity folding that never changes an output bit (a NaN stays a NaN of its sign;
its payload and quiet bit, which runtimes treat differently themselves, are not kept: a removed round trip no longer
quiets a signalling NaN, a folded constant Cast computes its NaNs through float64).

Public API: ``fold(model) -> FoldResult(model, report)``. Individual passes live one per module and follow
``base.GraphPass`` (``call(model) -> PassResult(model, modified)``).
"""

from __future__ import annotations

from .base import GraphPass, PassResult
from .pipeline import FoldResult, Pipeline, default_passes, fold

__all__ = ["FoldResult", "GraphPass", "PassResult", "Pipeline", "default_passes", "fold"]
