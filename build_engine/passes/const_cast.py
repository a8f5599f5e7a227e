"""Fold ``Cast`` of a constant into a new constant."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from .base import GraphPass
from .exact_cast import exact_cast
from .ir import GraphCtx
from .schema import constant_holds

#: A cast result up to this many elements is folded even when the source constant stays alive (model grows a bit).
SMALL_CONSTANT = 4096


class FoldConstantCast(GraphPass):
    """``y = Cast(c, to=U)`` where ``c`` is an initializer (not overridable as a graph input) or a Constant node's
    value becomes a constant holding ``exact_cast(c)`` (an initializer named ``y``, or a Constant node producing
    ``y`` inside functions, when ``y`` is a graph output, and in models below IR 4, whose initializers must all be
    graph inputs).

    Must not fire when:
    - ``exact_cast`` refuses: out-of-range / NaN / inf float->int, out-of-range int narrowing, NaN->bool, casts to
      float8, unknown types (left to the runtime, which defines them);
    - ``c`` is an initializer that is also a graph input (it can be overridden at run time);
    - the constant lives in external data that was not loaded, or ``to`` is a function attribute reference;
    - the result is large (> ``SMALL_CONSTANT`` elements) and ``c`` has other readers (would duplicate weights);
    - it would be a Constant node of a type the Constant schema at this opset does not hold (int64 before opset 9:
      ``schema.constant_holds``).
    """

    name = "constant_cast"
    incremental = True

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        for n in ctx.casts():
            if len(n.outputs) != 1:
                continue
            src_name, y = n.inputs[0], n.outputs[0]
            tensor = ctx.constant_tensor(src_name)
            to = n.to
            if tensor is None or to is None:
                continue
            try:
                arr = numpy_helper.to_array(tensor)
            except Exception:  # external data not loaded, unsupported storage
                continue
            if arr.size > SMALL_CONSTANT and ctx.num_uses(src_name) > 1:
                continue
            out = exact_cast(np.asarray(arr), tensor.data_type, to)
            if out is None:
                continue
            value = numpy_helper.from_array(np.asarray(out), name=y)
            value.data_type = to  # from_array picks the ONNX type from numpy; keep exactly `to`
            if not ctx.may_add_initializers or y in ctx.output_set:
                if not constant_holds(to, ctx.opset):
                    continue
                ctx.replace_node(n, helper.make_node("Constant", [], [y], value=value, name=n.proto.name))
            else:
                ctx.remove_node(n)
                ctx.add_initializer(value)
            ctx.set_type(y, to)
            ctx.rules[self.name] += 1
            count += 1
        return count
