"""``Shape(Cast(x))`` -> ``Shape(x)`` (and ``Size``): a Cast never changes a shape."""

from __future__ import annotations

from .base import GraphPass
from .ir import GraphCtx
from .schema import accepts


class ShapeOfCast(GraphPass):
    """Read the shape (or size) from the Cast's input, so the Cast may die.

    Must not fire when:
    - ``x`` has no name (optional input) or the Cast is from a custom domain;
    - the schema of ``Shape``/``Size`` at this opset does not take ``x``'s type (asked of ``onnx.defs``), or
      ``x``'s type is unknown inside a function (skipped);
    - ``x`` is shadowed between this graph and the Cast's (a subgraph's local of the same name).
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
            t = ctx.type_of(c.inputs[0])
            if ctx.is_function and not t:
                continue
            if not ctx.reads_same(c.inputs[0], n.inputs[0]) or not accepts(n.op, n.domain, ctx.opset, [t]):
                continue
            ctx.set_input(n, 0, c.inputs[0])
            ctx.rules[self.name] += 1
            count += 1
        return count
