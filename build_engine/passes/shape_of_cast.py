"""``Shape(Cast(x))`` -> ``Shape(x)`` (and ``Size``): a Cast never changes a shape."""

from __future__ import annotations

from .base import GraphPass
from .ir import GraphCtx


class ShapeOfCast(GraphPass):
    """Read the shape (or size) from the Cast's input, so the Cast may die.

    Must not fire when:
    - ``x`` has no name (optional input) or the Cast is from a custom domain;
    - the opset's ``Shape``/``Size`` could not take ``x``'s type: a Cast's input types at an opset are a subset of
      Shape's there, so this only matters when ``x``'s type is unknown *and* the Cast is in a function (skipped).
    """

    name = "shape_of_cast"

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        for n in ctx.nodes:
            if not (n.alive and n.op in ("Shape", "Size") and n.onnx_op and n.inputs and n.inputs[0]):
                continue
            c = ctx.source(n.inputs[0])
            if c is None or not c.is_cast:
                continue
            if ctx.is_function and not ctx.type_of(c.inputs[0]):
                continue
            ctx.set_input(n, 0, c.inputs[0])
            ctx.rules["shape_of_cast"] += 1
            count += 1
        return count
