"""Move an exact Cast through pure data-movement ops so that it meets, and collapses with, the next Cast."""

from __future__ import annotations

from . import dtypes as dt
from .base import GraphPass
from .ir import GraphCtx
from .node import Node
from .same_cast import RemoveSameTypeCast, remove_same_type_cast
from .schema import accepts

_MAX_CHAIN = 32


class SinkCastThroughDataMovement(GraphPass):
    """``Cast(M_k(...M_1(Cast(x, U))...), V)`` with every ``M_i`` in ``dtypes.DATA_MOVEMENT`` (Reshape, Transpose,
    Squeeze, Unsqueeze, Flatten, Expand, Slice, Gather/GatherElements/GatherND on the data input, Tile, ...)
    becomes ``Cast(M_k(...M_1(x)...), V)``: data movement copies values, so it commutes with an exact Cast, and the
    outer Cast then sees exactly the values of ``x`` (same-type/round-trip rules finish the job when ``V`` is
    ``x``'s type).

    Must not fire when:
    - ``U`` does not embed ``T`` (the type of ``x``), or ``T`` is unknown, or this opset's generic ops cannot take
      ``T`` (bfloat16 before opset 13), or ``T`` is a float8 type (several data-movement ops, e.g. Gather-13 and
      Tile-13, do not take float8 at any opset);
    - the Cast feeds an ``M_i`` through a non-data input (Gather indices, Reshape shape, Slice starts, ...);
    - an intermediate value has another reader, is a graph output or is read by a subgraph (it would change type
      under that reader);
    - it would not remove a Cast: the first Cast keeps other readers and ``V != T``;
    - ``T -> V`` is not defined on every value of ``T`` (``dtypes.cast_defined``: float->int, out-of-range
      narrowing, ...), since the last Cast would then compute ``T -> V`` where it computed ``U -> V``;
    - an ``M_i``'s schema at this opset does not accept ``T`` (Flatten before opset 9 takes only floats; asked of
      ``onnx.defs``), nor the last Cast's.
    """

    name = "sink_cast"
    incremental = True

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        for c1 in ctx.casts():
            x, y = c1.inputs[0], c1.outputs[0]
            t, u = ctx.type_of(x), c1.to
            if (u is None or u == t or not dt.embeds(u, t) or not dt.op_accepts(t, ctx.opset)
                    or t in dt.FLOAT8):
                continue
            for m1 in ctx.consumers(y):
                chain = self._chain(ctx, m1, y)
                if chain is None:
                    continue
                c2 = chain.pop()
                if c2.to != t and ctx.num_uses(y) > 1:
                    continue
                if (c2.to != t and not dt.cast_defined(t, c2.to or 0)) or not self._schema_ok(ctx, chain, c2, t):
                    continue
                ctx.set_input(chain[0], 0, x)
                for m in chain:
                    ctx.set_type(m.outputs[0], t, retyped=True)
                ctx.rules[self.name] += 1
                # the last Cast is now T -> T: removed at once, not a round later
                count += 1 + remove_same_type_cast(ctx, c2, RemoveSameTypeCast.name)
                # on to the Cast's other readers: each chain below it moves in this walk, not one per round
        return count

    @staticmethod
    def _schema_ok(ctx: GraphCtx, chain: list[Node], last: Node, t: int) -> bool:
        """Every moved op, and the last Cast, accept ``T`` as their data input at this opset."""
        for m in (*chain, last):
            types = [t] + [ctx.type_of(i) if i else 0 for i in m.inputs[1:]]
            if not accepts(m.op, m.domain, ctx.opset, types):
                return False
        return True

    @staticmethod
    def _chain(ctx: GraphCtx, first: Node, value: str) -> list[Node] | None:
        """[M_1, ..., M_k, Cast] following single readers from ``first``; None when the path breaks."""
        chain: list[Node] = []
        node, cur = first, value
        for _ in range(_MAX_CHAIN):
            if not node.alive or not node.onnx_op:
                return None
            if node.op == "Cast":
                return chain + [node] if chain and node.to is not None else None
            if (node.op not in dt.DATA_MOVEMENT or len(node.outputs) != 1 or not node.inputs
                    or node.inputs[0] != cur or cur in node.inputs[1:] or node.free):
                return None
            chain.append(node)
            cur = node.outputs[0]
            if cur in ctx.output_set or ctx.implicit.get(cur) or ctx.num_uses(cur) != 1:
                return None
            readers = ctx.consumers(cur)
            if len(readers) != 1:
                return None
            node = readers[0]
        return None
