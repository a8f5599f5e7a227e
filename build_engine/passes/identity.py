"""Remove ``Identity`` nodes."""

from __future__ import annotations

from .base import GraphPass
from .ir import GraphCtx


class RemoveIdentity(GraphPass):
    """``y = Identity(x)``: readers of ``y`` read ``x``; when ``y`` is a graph output, ``x``'s producer makes ``y``.

    Must not fire (all enforced by ``GraphCtx.bypass``):
    - ``y`` is a graph output and ``x`` is another graph output (two outputs must stay two names);
    - ``y`` is a graph output and ``x`` is a graph input (Identity between input and output: nothing to rename);
    - ``y`` is a graph output and ``x`` is an initializer or a value of an enclosing scope;
    - it never renames a graph output, and it skips Identity nodes of custom domains and on non-tensor values
      whose producer is unknown only when the output is protected (the value is passed through unchanged).
    """

    name = "identity"

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        for n in ctx.nodes:
            if (n.alive and n.op == "Identity" and n.onnx_op and len(n.inputs) == 1 and len(n.outputs) == 1
                    and n.inputs[0] and ctx.bypass(n, n.inputs[0], self.name)):
                count += 1
        return count
