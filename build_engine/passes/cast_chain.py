"""Shorten an exact chain ``T -> U -> V`` to ``T -> V``."""

from __future__ import annotations

from . import dtypes as dt
from .base import GraphPass
from .ir import GraphCtx
from .schema import accepts


class CollapseCastChain(GraphPass):
    """``z = Cast(Cast(x, to=U), to=V)`` becomes ``z = Cast(x, to=V)`` when ``U`` embeds ``T`` (the type of ``x``).

    The first Cast is exact, so the second sees exactly the value ``x``; when ``T -> V`` is defined on every value
    of ``T`` (``dtypes.cast_defined``), ``U -> V`` is defined on those values too and gives the same bits.
    Must not fire when:
    - ``U`` does not embed ``T``: f32->f16->int8 (the fp16 rounding/clamping changes the integer), f64->f32->f16
      (double rounding), f32->int32->f16 (truncation first);
    - ``T -> V`` is not defined on every input value: uint32->double->int32 (2**31 is out of range for the
      double->int32 Cast: INT_MIN in onnx.reference, wrap-around for uint32->int32), fp16->fp32->uint32 (NaN), any
      float->int, out-of-range integer narrowing, int32->double->fp16 (rounding paths);
    - ``x`` is shadowed between this graph and the inner Cast's (``reads_same``), or the Cast schema at this opset
      does not take ``T``;
    - ``x``'s type is unknown or a ``to`` is a function attribute reference;
    - ``V == T`` (the round-trip rule removes the pair instead);
    - the generic ops of this opset cannot take ``T`` (never widens what the graph already casts from: ``x`` is
      already a Cast input, so this only guards function-attribute cases).
    """

    name = "cast_chain"
    incremental = True

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        for n, inner in ctx.cast_pairs():
            x = inner.inputs[0]
            t, u, v = ctx.type_of(x), inner.to, n.to
            if (u is None or v is None or v == t or not dt.embeds(u, t) or not dt.cast_defined(t, v)
                    or not ctx.reads_same(x, n.inputs[0]) or not accepts("Cast", n.domain, ctx.opset, [t])):
                continue
            ctx.set_input(n, 0, x)
            ctx.rules[self.name] += 1
            count += 1
        return count
