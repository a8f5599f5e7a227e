"""``CastLike(x, t)`` -> ``Cast(x, to=T)`` when ``t``'s element type ``T`` is known, so every Cast rule applies.

Exporters that do not run their own optimizer (torch's dynamo exporter) leave CastLike nodes whose target is a
constant or a value of a known type: ``CastLike(arange_start, end)``, ``CastLike(fill_value, x)``. By the operator's
definition, CastLike casts its first input to the element type of its second, with the same ``saturate``
semantics as Cast at the same opset; its second input's values are never read. So the Cast to ``T`` is the same
function bit for bit, and then the same-type, round-trip, chain and constant rules fold it like any Cast (a
same-type CastLike becomes a same-type Cast, which ``same_type_cast`` removes under its own conditions).

``round_mode`` (opset 24+) is where the readings part: the CastLike schema says it rounds a cast to float8e8m0 as
Cast's does, but the function body onnx gives CastLike (which onnxruntime runs; onnx.reference refuses the
attribute) passes only ``saturate`` on, so it always rounds ``up``. A CastLike to float8e8m0 with a ``round_mode``
other than ``up`` therefore stays as written. To any other type the attribute means nothing in either reading and is
not copied: onnxruntime's Cast refuses a ``round_mode`` other than ``up`` there.
"""

from __future__ import annotations

from functools import lru_cache

import onnx
from onnx import AttributeProto, NodeProto, TensorProto, helper

from .base import GraphPass
from .ir import GraphCtx
from .schema import accepts, output_holds


@lru_cache(maxsize=64)
def _cast_attributes(opset: int) -> frozenset[str] | None:
    """The attributes Cast has at ``opset`` (None: no Cast schema there)."""
    try:
        return frozenset(onnx.defs.get_schema("Cast", opset, "").attributes)
    except Exception:
        return None


def _kept_attributes(p: NodeProto, to: int) -> list[AttributeProto] | None:
    """The CastLike's attributes that its Cast carries (all but a ``round_mode`` to a type other than float8e8m0),
    or None when the rewrite must not fire: a ``round_mode`` to float8e8m0 that is not the literal ``up`` (a function
    attribute reference included), on which CastLike's schema and its function body disagree."""
    kept = []
    for a in p.attribute:
        if a.name == "round_mode":
            if to != TensorProto.FLOAT8E8M0:
                continue
            if a.ref_attr_name or a.type != AttributeProto.STRING or a.s != b"up":
                return None
        kept.append(a)
    return kept


class CastLikeToCast(GraphPass):
    """Rewrite a default-domain ``CastLike`` into the ``Cast`` it denotes (same name, output and attributes).

    Must not fire when:
    - the target (second input) has no name or its element type is unknown here (a function's polymorphic input,
      a value no type fact reaches), or the first input has no name;
    - the node has an attribute Cast does not have at this opset, or the Cast schema at this opset does not accept
      the input type or the target type (asked of ``onnx.defs``);
    - the target is float8e8m0 and ``round_mode`` is set to anything but ``up`` (``_kept_attributes``);
    - the node is of a custom domain.
    """

    name = "cast_like_to_cast"

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        allowed = _cast_attributes(ctx.opset)
        if allowed is None:
            return 0
        for n in ctx.nodes:
            if not (n.alive and n.op == "CastLike" and n.onnx_op and len(n.inputs) == 2 and all(n.inputs)):
                continue
            to = ctx.type_of(n.inputs[1])
            src = ctx.type_of(n.inputs[0])
            if not to or not output_holds("Cast", to, ctx.opset) or not accepts("Cast", "", ctx.opset, [src]):
                continue
            p = n.proto
            kept = _kept_attributes(p, to)
            if kept is None or any(a.name not in allowed for a in kept):
                continue
            cast = helper.make_node("Cast", [n.inputs[0]], list(n.outputs), name=p.name, to=to)
            cast.attribute.extend(kept)
            if p.doc_string:
                cast.doc_string = p.doc_string
            out = n.outputs[0]
            ctx.replace_node(n, cast)
            if out and out not in ctx.types:
                ctx.set_type(out, to)
            ctx.rules[self.name] += 1
            count += 1
        return count
