"""Merge duplicate sibling Casts (same input, same attributes)."""

from __future__ import annotations

from trtforge.build_engine.passes.base import GraphPass
from trtforge.build_engine.passes.ir import GraphCtx, Node


def _key(n: Node) -> tuple:
    attrs = tuple(sorted((a.name, a.SerializeToString()) for a in n.proto.attribute))
    return (n.inputs[0], attrs)


class MergeDuplicateCasts(GraphPass):
    """Among Casts that read the same value with identical attributes, keep the first (in topological order) and
    let readers of the others read it.

    Must not fire when:
    - a later duplicate's output is a graph output (its name must survive; the earlier one cannot be renamed onto
      it without merging two outputs or breaking the order) -- it is kept as is;
    - any attribute differs (``to``, ``saturate``, ``round_mode``) or an attribute is a function reference.
    """

    name = "duplicate_cast"

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        for name, readers in list(ctx.uses.items()):
            casts = [n for n in readers if n.op == "Cast" and n.onnx_op and n.alive and n.inputs[0] == name]
            if len(casts) < 2:
                continue
            casts.sort(key=ctx.position)
            seen: dict[tuple, Node] = {}
            for c in casts:
                if any(a.ref_attr_name for a in c.proto.attribute):
                    continue
                k = _key(c)
                first = seen.get(k)
                if first is None:
                    seen[k] = c
                elif c.outputs[0] not in ctx.output_set and ctx.bypass(c, first.outputs[0], "duplicate_cast"):
                    count += 1
        return count
