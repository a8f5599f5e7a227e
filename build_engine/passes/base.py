"""The pass contract: a small class with a ``name`` and ``call(model) -> PassResult(model, modified)``.

A pass rewrites one graph view at a time (``rewrite(ctx) -> number of rewrites``); ``call`` applies it once to the
main graph, every If/Loop/Scan body (recursively) and every model-local function, *in place* (``fold`` copies the
caller's model first). Each pass's docstring lists the cases where it must not fire.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import ModelProto

from .ir import GraphCtx
from .walk import run_passes


@dataclass(frozen=True)
class PassResult:
    model: ModelProto
    modified: bool


class GraphPass:
    """Base class. Subclasses set ``name`` and implement ``rewrite``."""

    name: str = "pass"
    # walks after the first visit only the Casts a rewrite touched since this pass's previous walk (``dirty``): set
    # where every rule of the pass reads no more than ``dirty`` lists, and it walks ``ctx.casts()`` only
    incremental: bool = False

    def rewrite(self, ctx: GraphCtx) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def call(self, model: ModelProto) -> PassResult:
        stats = run_passes(model, [self], fixed_point=False)
        return PassResult(model, stats.rewrites > 0)

    def __call__(self, model: ModelProto) -> PassResult:
        return self.call(model)
