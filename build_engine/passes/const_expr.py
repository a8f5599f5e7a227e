"""Evaluate a constant expression feeding a Cast (with ``onnx.reference``), so that the Cast folds too; and, for the
precision policy, the value of any main-graph name computed from constants that way (``constant_values``)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import dtypes as dt
from .base import GraphPass
from .const_cast import SMALL_CONSTANT
from .exact_cast import exact_cast
from .ir import GraphCtx, Scope
from .node import Node
from .schema import constant_holds
from .walk import default_opset, graph_types, training_state

#: Ops whose result is specified bit for bit (IEEE-754 correctly rounded elementwise arithmetic in the tensor's own
#: type, integer arithmetic, comparisons, logic, shape and data movement), so the value onnx.reference computes is
#: the value every runtime computes. Transcendentals (Exp, Sin, Pow, ...), reductions over floats (order-dependent)
#: and integer Div/Mod (rounding conventions) are not in it.
EXACT_OPS = frozenset({
    "Add", "Sub", "Mul", "Neg", "Abs", "Min", "Max", "Floor", "Ceil", "Sqrt", "Div",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Where",
    "Shape", "Size", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Slice", "Gather",
    "Expand", "Tile", "Identity", "ConstantOfShape", "Range", "Cast",
})
_FLOAT_ONLY = frozenset({"Div", "Sqrt"})
_INT_ONLY = frozenset({"Range"})
_MAX_CONE = 64
#: No value on the way to a folded constant is computed above this many elements (``_evaluate``).
_MAX_ELEMENTS = 1 << 20


class FoldConstantExpression(GraphPass):
    """``y = Cast(f(c1, c2, ...))`` where every leaf ``c_i`` is a constant (an initializer that is not a graph input,
    or a Constant node) and every op of ``f`` is in ``EXACT_OPS``: the producer of ``f``'s result is replaced by a
    Constant holding the value ``onnx.reference`` computes for it, and ``constant_cast`` then folds the Cast (the
    rest of ``f`` dies when nothing else reads it).

    Must not fire when:
    - a leaf is a graph input, an outer-scope value, or anything not constant; an op is outside ``EXACT_OPS``, of a
      custom domain, has subgraphs, or is a Div/Sqrt on a non-float type, a Range on a non-integer type, a Cast
      that is not ``dtypes.cast_defined`` (results onnx.reference alone would decide);
    - the expression has more than 64 nodes, or its value more than ``SMALL_CONSTANT`` elements (bounded model
      growth when the expression's parts stay alive for other readers), or a value on the way to it more than
      ``_MAX_ELEMENTS`` or a shape onnx's inference does not fix from the constants (bounded work: known before
      the node runs, ``_evaluate``);
    - the Cast of the value would not fold (``exact_cast`` refuses: out-of-range float->int, ...): nothing is gained;
    - the Constant schema at this opset does not hold the value's type (int64 before opset 9);
    - onnx.reference cannot evaluate it;
    - a float Min or Max has a NaN among its inputs, or zeros of both signs (IEEE 754 leaves ``max(-0.0, +0.0)``
      and NaN handling to the implementation: numpy returns its second argument for float32 and its first for
      float16, ``fmax`` drops the NaN).
    """

    name = "constant_expression"

    def rewrite(self, ctx: GraphCtx) -> int:
        count = 0
        computable = ctx.pass_state.get(self.name)
        if not isinstance(computable, _Computable):
            computable = ctx.pass_state[self.name] = _Computable()
        reach = _from_constants(ctx)
        for c in ctx.casts():
            src = c.inputs[0]
            if src not in reach:
                continue
            p = ctx.producer.get(src)  # the cheap tests first; the membership test looks further up the graph
            if (p is None or not p.alive or p.op not in EXACT_OPS or len(p.outputs) != 1 or c.to is None
                    or not computable.holds(ctx, src) or ctx.constant_tensor(src) is not None):
                continue
            cone = _cone(ctx, p)
            if cone is None:
                continue
            value = _evaluate(ctx, cone, src)
            if value is None or value.size > SMALL_CONSTANT:
                continue
            t = ctx.type_of(src) or helper.np_dtype_to_tensor_dtype(value.dtype)
            if exact_cast(value, t, c.to) is None or not constant_holds(t, ctx.opset):
                continue
            tensor = numpy_helper.from_array(value, name=src)
            tensor.data_type = t
            ctx.replace_node(p, helper.make_node("Constant", [], [src], value=tensor, name=p.proto.name))
            ctx.set_type(src, t)
            ctx.rules[self.name] += 1
            count += 1
        return count


def constant_values(model: onnx.ModelProto, names: Iterable[str]) -> dict[str, np.ndarray | None]:
    """The value of each of ``names`` in ``model``'s main graph, exactly as every runtime computes it: a constant (an
    initializer that is not a graph input or training state, a Constant node) or a value computed from constants
    through ``EXACT_OPS`` only, within ``FoldConstantExpression``'s bounds (at most 64 nodes, no value on the way
    above ``_MAX_ELEMENTS`` elements). None for a name that is not one of those (a graph input reaches it, an op
    outside ``EXACT_OPS``, a weight still on disk), or that onnx.reference cannot evaluate. Builds one read-only view
    of the graph (nothing is rewritten); onnx.reference is imported only when an expression is evaluated."""
    graph = model.graph
    inputs = [*(i.name for i in graph.input), *sorted(training_state(model))]
    ctx = GraphCtx(graph, graph.node, inputs, [o.name for o in graph.output],
                   Scope(default_opset(model.opset_import), graph_types(graph)), initializers=list(graph.initializer))
    out: dict[str, np.ndarray | None] = {}
    for name in names:
        c = ctx.constant_tensor(name)
        p = ctx.producer.get(name)
        if c is not None:
            out[name] = numpy_helper.to_array(c)
        elif p is None or name in ctx.inputs:
            out[name] = None
        else:
            cone = _cone(ctx, p)
            out[name] = None if cone is None else _evaluate(ctx, cone, name)
    return out


def _from_constants(ctx: GraphCtx) -> set[str]:
    """Every value a live default-domain ``EXACT_OPS`` node without subgraphs computes from constants and such values
    only: found forward from the constants' readers, so a graph whose Casts read no constant expression costs only
    its constants' readers, not a walk up from every Cast. A superset of ``_Computable.holds``'s answers (it leaves
    out the node-order condition), used only to skip Casts that cannot qualify."""
    out: set[str] = set()
    const = {name for name in ctx.initializers if ctx.constant_tensor(name) is not None}
    stack = [n for name in const for n in ctx.consumers(name)]
    stack += [r for n in ctx.nodes if n.op == "Constant" and n.alive for o in n.outputs for r in ctx.consumers(o)]
    seen: set[Node] = set()
    while stack:
        n = stack.pop()
        if n in seen or not (n.alive and n.op in EXACT_OPS and n.onnx_op and not n.free):
            continue
        if not all(not i or i in out or i in const or ctx.constant_tensor(i) is not None for i in n.inputs):
            continue  # an input not (yet) known constant: the node comes back when that input's producer is found
        seen.add(n)
        for o in n.outputs:
            if o:
                out.add(o)
                stack.extend(ctx.consumers(o))
    return out


class _Computable:
    """Membership test for the values this graph computes from constants through ``EXACT_OPS`` only, decided on
    demand (memoised, iterative): only the Casts' inputs and what they are computed from are looked at, not the whole
    graph. A value qualifies when its producer is a live default-domain ``EXACT_OPS`` node without subgraphs whose
    inputs are each empty, a constant, or a qualifying value produced EARLIER in the node list (what one sweep in node
    order would find).

    The answers are kept for the view's life (``GraphCtx.pass_state``): every rewrite of every pass keeps them true.
    Each one makes a node read, instead of ``v``, a value ``w`` from ``v``'s own cone with ``v``'s value (Identity,
    same-type Cast, round trip, Cast chain, moved Cast, Shape/Gather of a Cast's input: Cast is in ``EXACT_OPS``, so
    ``v`` qualifies exactly when ``w`` does), or a duplicate Cast of the same input; or it turns a qualifying value
    into a constant of the same value (``constant_cast``, this pass), renames a producer onto a graph output whose
    old producer computed the same value from the same input, or removes a node nobody reads. Positions never
    change (``replace_node`` keeps the index). And the answer is only a filter: ``_cone`` checks each candidate
    again, so a stale True could cost time, never exactness."""

    def __init__(self) -> None:
        self.memo: dict[str, bool] = {}  # not the view itself: a reference cycle would outlive fold (GC is off)

    def _inputs_state(self, ctx: GraphCtx, p: Node) -> bool | str:
        """False when an input cannot qualify, else the first input not decided yet, else True."""
        memo = self.memo
        pending: bool | str = True
        for i in p.inputs:
            if not i or ctx.constant_tensor(i) is not None:
                continue
            q = ctx.producer.get(i)
            r = memo.get(i)
            if r is False or q is None or ctx.position(q) >= ctx.position(p):
                return False
            if r is None and pending is True:
                pending = i
        return pending

    def holds(self, ctx: GraphCtx, name: str) -> bool:
        memo = self.memo
        known = memo.get(name)
        if known is not None:
            return known
        stack = [name]
        while stack:
            v = stack[-1]
            if v in memo:
                stack.pop()
                continue
            p = ctx.producer.get(v)
            if p is None or not (p.alive and p.op in EXACT_OPS and p.onnx_op and not p.free):
                state: bool | str = False
            else:
                state = self._inputs_state(ctx, p)
            if isinstance(state, str):
                stack.append(state)
            else:
                memo[v] = state
                stack.pop()
        return memo[name]


def _exact_here(ctx: GraphCtx, n: Node) -> bool:
    if not n.onnx_op or n.op not in EXACT_OPS or n.free or not n.alive or n.op == "Constant":
        return n.op == "Constant" and n.onnx_op
    t = ctx.type_of(n.inputs[0]) if n.inputs and n.inputs[0] else 0
    if n.op in _FLOAT_ONLY and t not in dt.FLOATS:
        return False
    if n.op in _INT_ONLY and t not in dt.INTS:
        return False
    return n.op != "Cast" or (n.to is not None and dt.cast_defined(t, n.to))


def _cone(ctx: GraphCtx, root: Node) -> list[Node] | None:
    """The nodes computing ``root`` from constants only, in topological order; None when it is not such a cone."""
    seen: dict[int, Node] = {}
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        if not _exact_here(ctx, n) or len(seen) >= _MAX_CONE:
            return None
        seen[id(n)] = n
        for i in n.inputs:
            if not i or ctx.constant_tensor(i) is not None:
                continue
            p = ctx.producer.get(i)
            if p is None or i in ctx.inputs:
                return None
            stack.append(p)
    return sorted(seen.values(), key=ctx.position)


def _evaluate(ctx: GraphCtx, cone: list[Node], out: str) -> np.ndarray | None:
    """The value of ``out``, computed by onnx.reference node by node over ``cone`` (topologically ordered); None when
    it cannot evaluate a node, or when a node's output would have more than ``_MAX_ELEMENTS`` elements or a shape
    onnx's inference does not fix from the node's (constant) inputs. The size is known before the node runs, so a
    tiny model whose constant expression expands to gigabytes (``ConstantOfShape([10**5, 10**5])`` then ``Slice``)
    costs nothing: only the last value must be small (``SMALL_CONSTANT``), the bound is for what leads to it."""
    values: dict[str, TensorProto] = {}
    for n in cone:
        inputs = []
        for i in n.inputs:
            t = _value(ctx, values, i) if i else None
            if i and t is None:
                return None
            if t is not None:
                inputs.append(t)
        if n.op in ("Min", "Max") and not _order_free(inputs):
            return None
        outs = _run_node(n, inputs, ctx.opset)
        if outs is None:
            return None
        for name, a in zip(n.outputs, outs, strict=False):
            if name:
                try:
                    values[name] = numpy_helper.from_array(a, name=name)
                except Exception:  # no TensorProto for this value: leave it to the runtime
                    return None
    found = values.get(out)
    return None if found is None else numpy_helper.to_array(found)


def _order_free(inputs: list[TensorProto]) -> bool:
    """A Min/Max over these values has one answer in every runtime: integers, or floats without NaN and without
    zeros of both signs (the only floats that compare equal with other bits)."""
    arrays = [numpy_helper.to_array(t) for t in inputs]
    if not arrays or arrays[0].dtype.kind not in "fV":  # ml_dtypes' bfloat16 is kind 'V'
        return True
    wide = [a.astype(np.float64) for a in arrays]
    if any(np.isnan(a).any() for a in wide):
        return False
    zeros = [a[a == 0] for a in wide]
    return not (any(np.signbit(z).any() for z in zeros) and any((~np.signbit(z)).any() for z in zeros))


def _value(ctx: GraphCtx, values: dict[str, TensorProto], name: str) -> TensorProto | None:
    """``name``'s tensor: computed earlier in the cone, or a constant of this graph (a copy named ``name``)."""
    t = values.get(name)
    if t is None:
        c = ctx.constant_tensor(name)
        if c is not None:
            t = values[name] = TensorProto()
            t.CopyFrom(c)
            t.name = name
    return t


def _run_node(n: Node, inputs: list[TensorProto], opset: int) -> list[np.ndarray] | None:
    """``n``'s outputs from constant ``inputs`` (onnx.reference), or None: it cannot run it, or an output's size is
    not known before running (onnx shape inference, which reads the constant inputs) or exceeds ``_MAX_ELEMENTS``."""
    from onnx.reference import ReferenceEvaluator

    p = onnx.NodeProto()
    p.CopyFrom(n.proto)
    del p.input[:]
    p.input.extend(n.inputs)
    del p.output[:]
    p.output.extend(n.outputs)
    g = helper.make_graph([p], "constant_expression", [], [helper.make_value_info(o, onnx.TypeProto())
                                                             for o in n.outputs if o], initializer=inputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    try:
        if n.op != "Constant" and not _small_outputs(m, [o for o in n.outputs if o]):
            return None
        with np.errstate(all="ignore"):
            return [np.asarray(v) for v in ReferenceEvaluator(m).run(None, {})]
    except Exception:  # onnx.reference (or inference) cannot evaluate it: leave it to the runtime
        return None


def _small_outputs(m: onnx.ModelProto, outputs: list[str]) -> bool:
    """Every output of the one-node model ``m`` has a shape onnx's inference fixes, of at most ``_MAX_ELEMENTS``."""
    inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    shapes = {v.name: v.type.tensor_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    for o in outputs:
        tt = shapes.get(o)
        if tt is None or not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
            return False
        if int(np.prod([d.dim_value for d in tt.shape.dim], dtype=object)) > _MAX_ELEMENTS:
            return False
    return True
