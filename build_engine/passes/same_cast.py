"""Remove a ``Cast`` to the type its input already has."""

from __future__ import annotations

from . import dtypes as dt
from .base import GraphPass
from .ir import GraphCtx
from .node import Node


class RemoveSameTypeCast(GraphPass):
    """``y = Cast(x, to=T)`` where ``x`` is already ``T``: an Identity, removed like one.

    Must not fire when:
    - ``x``'s type is unknown (no value_info, polymorphic function input) or ``to`` is a function attribute
      reference;
    - ``y`` is a graph output and ``x`` is a graph input, another graph output, an initializer or an outer value
      (the Identity rules of ``GraphCtx.bypass``).
    - ``x`` is float8e5m2 and ``saturate`` is 1 (the default): that Cast turns +-inf into +-57344;
    - ``x`` is float8e8m0: onnx.reference's Cast to it rounds (``round_mode``) even a float8e8m0 value (2**-127).
    """

    name = "same_type_cast"
    incremental = True

    def rewrite(self, ctx: GraphCtx) -> int:
        return sum(remove_same_type_cast(ctx, n, self.name) for n in ctx.casts())


def remove_same_type_cast(ctx: GraphCtx, n: Node, rule: str) -> bool:
    """``RemoveSameTypeCast`` at the Cast ``n``: whether it removed it."""
    to = n.to
    if to != ctx.type_of(n.inputs[0]):
        return False
    sat = n.attr("saturate")
    if not dt.same_type_cast_is_identity(to, 1 if sat is None else n.int_attr("saturate")):
        return False
    return ctx.bypass(n, n.inputs[0], rule)
