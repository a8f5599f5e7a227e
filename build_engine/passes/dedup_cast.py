"""Merge duplicate sibling Casts (same input, same attributes)."""

from __future__ import annotations

from collections.abc import Iterable

from . import dtypes as dt
from .base import GraphPass
from .ir import GraphCtx
from .node import ALIVE, Node

_INT_OR_BOOL = dt.INTS | {dt.B}


def _key(n: Node) -> tuple | None:
    """Identity of a Cast's computation: input and attributes (None when an attribute is a function reference)."""
    attrs = n.proto.attribute
    if len(attrs) == 1:  # just `to` (the common case): no serialization
        return (n.inputs[0], n.to)
    if any(a.ref_attr_name for a in attrs):
        return None
    return (n.inputs[0], tuple(sorted((a.name, a.SerializeToString()) for a in attrs)))


def _candidates(ctx: GraphCtx) -> Iterable[Node]:
    """``ctx.casts()``, widened in an incremental walk (``ctx.since``) to every Cast reading the input of a touched
    one, in node order: a group's first member decides, touched or not."""
    casts = ctx.casts()
    if not ctx.since:
        return casts
    group = {r for i in {c.inputs[0] for c in casts} for r in ctx.consumers(i) if r.is_cast}
    return filter(ALIVE, sorted(group, key=ctx.position))  # a group member merged away on the walk is skipped


class MergeDuplicateCasts(GraphPass):
    """Among Casts that read the same value with identical attributes, keep the first (in topological order) and
    let readers of the others read it.

    Must not fire when:
    - a later duplicate's output is a graph output (its name must survive; the earlier one cannot be renamed onto
      it without merging two outputs or breaking the order) -- it is kept as is;
    - any attribute differs (``to``, ``saturate``, ``round_mode``) or an attribute is a function reference;
    - the Cast is to an integer or bool type and its result is undefined on some value of the input's type (or the
      input's type is unknown): float -> int on NaN/inf/out-of-range, out-of-range narrowing. Undefined results may
      legitimately differ between two nodes (one fused into a kernel, the other not); merging would pin them.
      Casts to float types are fully defined up to a runtime's rounding path, which is the same for two identical
      nodes, so they merge.
    """

    name = "duplicate_cast"
    incremental = True

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        seen: dict[tuple, Node] = {}
        for c in _candidates(ctx):  # node (topological) order: the first of a group dominates the others' readers
            if c.to in _INT_OR_BOOL and not dt.cast_defined(ctx.type_of(c.inputs[0]), c.to or 0):
                continue
            k = _key(c)
            if k is None:
                continue
            first = seen.get(k)
            if first is None or not first.alive:
                seen[k] = c
            elif c.outputs[0] not in ctx.output_set and ctx.bypass(c, first.outputs[0], self.name):
                count += 1
        return count
