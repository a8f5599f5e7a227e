"""Drop an exact integer Cast feeding the indices of Gather / GatherElements (both accept int32 and int64)."""

from __future__ import annotations

from onnx import TensorProto

from . import dtypes as dt
from .base import GraphPass
from .ir import GraphCtx
from .schema import accepts

_INDEX_TYPES = (TensorProto.INT32, TensorProto.INT64)
_OPS = ("Gather", "GatherElements")


class GatherIndexCast(GraphPass):
    """``Gather(data, Cast(i, to=U))`` -> ``Gather(data, i)`` when ``i`` is int32/int64, ``U`` is int32/int64 and
    ``U`` embeds ``i``'s type (int32 -> int64): the index values are the same, and Gather's ``Tind`` takes both.

    Must not fire when:
    - the Cast narrows (int64 -> int32 wraps out-of-range indices) or comes from a non-integer type;
    - the op's indices accept only int64 (GatherND, Expand, Reshape, ...) -- those ops are not touched;
    - the Cast output is read as the data input (that is a data-movement case, not an index case);
    - the op's schema at this opset does not take ``i``'s type as indices, or ``i`` is shadowed here.
    """

    name = "gather_index_cast"

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        for n in ctx.nodes:
            if not (n.alive and n.op in _OPS and n.onnx_op and len(n.inputs) == 2 and n.inputs[1]):
                continue
            c = ctx.source(n.inputs[1])
            if c is None or not c.is_cast or n.inputs[0] == n.inputs[1]:
                continue
            src, u = ctx.type_of(c.inputs[0]), c.to
            if (src in _INDEX_TYPES and u in _INDEX_TYPES and u != src and dt.embeds(u, src)
                    and ctx.reads_same(c.inputs[0], n.inputs[1])
                    and accepts(n.op, n.domain, ctx.opset, [ctx.type_of(n.inputs[0]), src])):
                ctx.set_input(n, 1, c.inputs[0])
                ctx.rules[self.name] += 1
                count += 1
        return count
