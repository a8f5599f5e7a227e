"""Remove a ``Cast`` to the type its input already has."""

from __future__ import annotations

from trtforge.build_engine.passes.base import GraphPass
from trtforge.build_engine.passes.ir import GraphCtx


class RemoveSameTypeCast(GraphPass):
    """``y = Cast(x, to=T)`` where ``x`` is already ``T``: an Identity, removed like one.

    Must not fire when:
    - ``x``'s type is unknown (no value_info, polymorphic function input) or ``to`` is a function attribute
      reference;
    - ``y`` is a graph output and ``x`` is a graph input, another graph output, an initializer or an outer value
      (the Identity rules of ``GraphCtx.bypass``).
    ``saturate``/``round_mode`` do not matter: a same-type Cast never rounds.
    """

    name = "same_type_cast"

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        for n in ctx.nodes:
            if not (n.alive and n.op == "Cast" and n.onnx_op and n.inputs and n.inputs[0]):
                continue
            to = n.int_attr("to")
            if to is not None and to == ctx.type_of(n.inputs[0]) and ctx.bypass(n, n.inputs[0], "same_type_cast"):
                count += 1
        return count
