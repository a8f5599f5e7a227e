"""Remove nodes whose outputs nobody reads, and initializers nobody reads."""

from __future__ import annotations

from .base import GraphPass
from .ir import GraphCtx


class RemoveDeadNodes(GraphPass):
    """Drop default-domain nodes none of whose outputs is read (by a node, a subgraph, or as a graph output), in
    reverse topological order so whole dead chains go in one sweep; then drop unread initializers.

    Must not fire on:
    - nodes of custom domains (plugins may have effects ONNX cannot see) or nodes with no outputs;
    - initializers that are also graph inputs (part of the model's interface), or read only by a subgraph;
    - graph or function outputs, even when nothing else reads them.
    """

    name = "dead_nodes"
    initializers_rule = "dead_initializers"  # its second counter: initializers nothing reads any more

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        uses, implicit, protected = ctx.uses, ctx.implicit, ctx.output_set
        for n in reversed(ctx.nodes):
            if not n.alive or not n.onnx_op or not n.outputs:
                continue
            # ``ctx.num_uses(o) == 0`` for every output, inlined (this loop visits every node each round)
            if all(not o or (not uses.get(o) and not implicit.get(o) and o not in protected) for o in n.outputs):
                ctx.remove_node(n)
                ctx.rules[self.name] += 1
                count += 1
        if not ctx.is_function:
            for name in list(ctx.initializers):
                if name not in ctx.inputs and ctx.num_uses(name) == 0:
                    ctx.drop_initializer(name)
                    ctx.rules[self.initializers_rule] += 1
                    count += 1
        return count
