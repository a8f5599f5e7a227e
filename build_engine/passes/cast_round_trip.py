"""Remove an exact round trip ``T -> U -> T``."""

from __future__ import annotations

from . import dtypes as dt
from .base import GraphPass
from .ir import GraphCtx


class CollapseCastRoundTrip(GraphPass):
    """``z = Cast(Cast(x, to=U), to=T)`` with ``x`` of type ``T``: ``z`` is ``x`` when ``U`` embeds ``T``.

    Must not fire when:
    - ``U`` does not embed ``T`` (``dtypes.embeds``): fp32->fp16->fp32 rounds and clamps, f32->i32->f32 truncates,
      i32->f32->i32 rounds above 2**24, bf16<->fp16 loses range or precision, anything->bool->anything collapses;
    - ``x``'s type is unknown or either ``to`` is a function attribute reference;
    - ``x`` is shadowed between this graph and the inner Cast's (a subgraph's local of the same name);
    - ``z`` is a graph output and ``x`` is a graph input / another graph output / initializer / outer value.
    The inner Cast stays while something else reads it (dead-node elimination removes it otherwise).
    """

    name = "cast_round_trip"
    incremental = True

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        for n, inner in ctx.cast_pairs():
            x = inner.inputs[0]
            t, u, t2 = ctx.type_of(x), inner.to, n.to
            if u is None or t2 != t or not dt.embeds(u, t) or not ctx.reads_same(x, n.inputs[0]):
                continue
            if ctx.bypass(n, x, self.name):
                count += 1
        return count
