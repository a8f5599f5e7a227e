"""Remove nodes whose outputs nobody reads, and initializers nobody reads."""

from __future__ import annotations

import heapq

from ..core.graph import CONTROL_FLOW_OPS, all_graphs, subgraphs
from .base import GraphPass
from .ir import GraphCtx
from .node import Node


def _holds_other_domain(n: Node) -> bool:
    """``n`` (If/Loop/Scan/SequenceMap) has a node of another domain in a body, at any depth: removing ``n`` would
    remove it too."""
    return n.op in CONTROL_FLOW_OPS and any(
        m.domain not in ("", "ai.onnx") for g in subgraphs(n.proto) for b in all_graphs(g) for m in b.node)


def _reads_kept(ctx: GraphCtx, n: Node) -> bool:
    """``n`` reads (itself or in a body) a name of ``ctx.kept_reads``: removing it may change what a sibling body's
    initializer of that name means to onnxruntime."""
    kept = ctx.kept_reads
    return bool(kept) and (any(i in kept for i in n.inputs) or bool(n.free & kept))


class RemoveDeadNodes(GraphPass):
    """Drop default-domain nodes none of whose outputs is read (by a node, a subgraph, or as a graph output), in
    reverse topological order so whole dead chains go in one sweep; then drop unread initializers.

    Must not fire on:
    - nodes of custom domains (plugins may have effects ONNX cannot see) or nodes with no outputs, nor a control-flow
      node whose body holds one at any depth (``fold --help``: nodes of other domains are kept, read or not);
    - initializers that are also graph inputs (part of the model's interface), or read only by a subgraph, or read or
      assigned by ``training_info`` (``walk.training_state``: the view counts those as graph inputs);
    - graph or function outputs, even when nothing else reads them.
    """

    name = "dead_nodes"
    initializers_rule = "dead_initializers"  # its second counter: initializers nothing reads any more

    def rewrite(self, ctx: GraphCtx) -> int:
        count = self._sweep(ctx) if ctx.maybe_dead is None else self._revisit(ctx)
        if not ctx.is_function:
            for name in list(ctx.initializers):
                if name not in ctx.inputs and ctx.num_uses(name) == 0:
                    ctx.drop_initializer(name)
                    ctx.rules[self.initializers_rule] += 1
                    count += 1
        return count

    def _dead(self, ctx: GraphCtx, n: Node) -> bool:
        # ``ctx.num_uses(o) == 0`` for every output, inlined (the first sweep visits every node)
        uses, implicit, protected = ctx.uses, ctx.implicit, ctx.output_set
        return (n.alive and n.onnx_op and bool(n.outputs)
                and all(not o or (not uses.get(o) and not implicit.get(o) and o not in protected) for o in n.outputs)
                and not _holds_other_domain(n) and not _reads_kept(ctx, n))

    def _sweep(self, ctx: GraphCtx) -> int:
        """Every node, in reverse order; from now on the view records which nodes lose a reader."""
        ctx.maybe_dead = set()
        count = 0
        uses, implicit, protected = ctx.uses, ctx.implicit, ctx.output_set
        for n in reversed(ctx.nodes):
            if not n.alive or not n.onnx_op or not n.outputs:
                continue
            # ``_dead`` inlined (this loop visits every node)
            if (all(not o or (not uses.get(o) and not implicit.get(o) and o not in protected) for o in n.outputs)
                    and not _holds_other_domain(n) and not _reads_kept(ctx, n)):
                ctx.remove_node(n)
                ctx.rules[self.name] += 1
                count += 1
                # the candidates this made before ``n`` are visited next by this sweep; one after it (a graph that is
                # not topologically sorted) is kept for the next call
                ctx.maybe_dead = {m for m in ctx.maybe_dead if m.index >= n.index}
        return count

    def _revisit(self, ctx: GraphCtx) -> int:
        """What a sweep would remove, visiting only nodes that lost a reader since the last one: a node that did not
        is as alive as it was then. Visited in decreasing position, as a sweep does; a candidate found at or after the
        current position (possible only in a graph that is not topologically sorted) is left for the next call, as a
        sweep would leave it for its next round."""
        assert ctx.maybe_dead is not None
        queued = {n for n in ctx.maybe_dead if n.alive}
        heap = [(-n.index, n) for n in queued]  # positions are unique: two entries never compare their nodes
        ctx.maybe_dead.clear()
        heapq.heapify(heap)
        count = 0
        while heap:
            neg, n = heapq.heappop(heap)
            if not self._dead(ctx, n):
                continue
            ctx.remove_node(n)
            ctx.rules[self.name] += 1
            count += 1
            later = [m for m in ctx.maybe_dead if m.index < -neg]
            for m in later:
                ctx.maybe_dead.discard(m)
                if m not in queued:
                    queued.add(m)
                    heapq.heappush(heap, (-m.index, m))
        return count
