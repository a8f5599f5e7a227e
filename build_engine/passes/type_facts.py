"""Element types of a node's outputs read off its op's schema: the facts that type inference would add, without it.

ONNX type constraints are equalities: every formal parameter bound to one type variable has one type in a valid model
(Add's ``A``, ``B`` and ``C`` are all ``T``). So where an output's type variable is also an input's, the output's
element type *is* that input's, and where the variable (or the formal itself) allows exactly one tensor type (Equal's
``T1`` is ``tensor(bool)``, Shape's output ``tensor(int64)``), that type is the output's. Nothing else is derived:
an output whose variable is bound only by an attribute (ConstantOfShape's ``value``, RandomNormal's ``dtype``) or
by a heterogeneous variadic (Loop's ``V``) stays unknown, and then the pipeline asks onnx's shape inference.

Safety conditions:
- only tensor facts: the types table holds tensor element types only (a sequence or optional value is never in
  it), and an input's known type is therefore a tensor type, which a shared variable hands on unchanged;
- the schema is the version in force at the graph's opset (``onnx.defs.get_schema(op, opset, domain)``), as shape
  inference reads it; an op unknown there yields no fact;
- control-flow ops (If/Loop/Scan) and heterogeneous variadics yield no fact (their outputs follow their bodies).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Protocol

import onnx
from onnx import AttributeProto, TensorProto

from ..core.graph import CONTROL_FLOW_OPS
from .dtypes import DATA_MOVEMENT


class Node(Protocol):
    """What these facts read of ``ir.Node`` (that module imports this one)."""

    op: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    onnx_op: bool
    to: int | None

    def attr(self, name: str) -> AttributeProto | None: ...


class GraphCtx(Protocol):
    """What these facts read of ``ir.GraphCtx``."""

    types: dict[str, int]
    opset: int

    @property
    def untyped(self) -> Sequence[Node]: ...

    def type_of(self, name: str) -> int: ...

# an output rule: an element type (the formal allows only it), or the formal-input indices sharing its variable
# (the last one variadic: every actual input from there on), or None (unknown from the schema)
_Rule = int | tuple[int, ...] | None
_TENSOR_TYPES: dict[str, int] = {
    f"tensor({name.lower()})": int(v) for name, v in TensorProto.DataType.items() if v != TensorProto.UNDEFINED}


@lru_cache(maxsize=4096)
def output_rules(op: str, domain: str, opset: int) -> tuple[tuple[_Rule, ...], bool, int] | None:
    """(rule per formal output, last output variadic, index of a variadic last formal input or -1), or None: no
    schema at ``opset`` (or a control-flow op)."""
    if op in CONTROL_FLOW_OPS and domain in ("", "ai.onnx"):
        return None
    try:
        s = onnx.defs.get_schema(op, opset, "" if domain == "ai.onnx" else domain)
    except Exception:
        return None
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    allowed = {c.type_param_str: tuple(c.allowed_type_strs) for c in s.type_constraints}
    heterogeneous = {f.type_str for f in (*s.inputs, *s.outputs) if f.option == variadic and not f.is_homogeneous}
    rules: list[_Rule] = []
    for f in s.outputs:
        spec = f.type_str
        if spec in heterogeneous:
            rules.append(None)
            continue
        strs = allowed.get(spec, (spec,))
        if len(strs) == 1 and strs[0] in _TENSOR_TYPES:
            rules.append(_TENSOR_TYPES[strs[0]])
            continue
        shared = tuple(k for k, i in enumerate(s.inputs) if i.type_str == spec and spec in allowed)
        rules.append(shared or None)
    var_in = len(s.inputs) - 1 if s.inputs and s.inputs[-1].option == variadic else -1
    var_out = bool(s.outputs) and s.outputs[-1].option == variadic
    return tuple(rules), var_out, var_in


def output_types(op: str, domain: str, opset: int, inputs: Sequence[str], type_of: Callable[[str], int],
                 n_outputs: int) -> list[int]:
    """Element type of each of ``n_outputs`` actual outputs (0 = not known from the schema) of a node reading the
    values named ``inputs`` ("" = an omitted optional input), whose known types ``type_of`` gives (0 = unknown)."""
    found = output_rules(op, domain, opset)
    if found is None:
        return [0] * n_outputs
    rules, var_out, var_in = found
    out: list[int] = []
    for k in range(n_outputs):
        if not rules or (k >= len(rules) and not var_out):
            out.append(0)
            continue
        rule = rules[min(k, len(rules) - 1)]
        if rule is None or isinstance(rule, int):
            out.append(rule or 0)
            continue
        t = 0
        for j in rule:  # the formal inputs bound to the output's variable (the variadic last one: all from j on)
            for name in (inputs[j:] if j == var_in else inputs[j:j + 1]):
                if name:
                    t = type_of(name)
                    if t:
                        break
            if t:
                break
        out.append(t)
    return out


@lru_cache(maxsize=4096)
def single_output_rule(op: str, opset: int) -> int | tuple[int, ...] | None:
    """``infer_local``'s answer for a default-domain node of ``op`` with one output that has no type yet, as data: an
    element type, or the input indices whose first known type is the output's (in that order), or None: ask
    ``infer_local`` (Cast, Constant, control flow, variadic inputs or outputs, no fact)."""
    if op in ("Cast", "Constant"):
        return None
    if op in ("Shape", "Size"):
        return int(TensorProto.INT64)
    if op in DATA_MOVEMENT:
        return (0,)
    found = output_rules(op, "", opset)
    if found is None or len(found[0]) != 1 or found[1]:
        return None
    rule, var_in = found[0][0], found[2]
    if isinstance(rule, int):
        return rule
    return None if rule is None or var_in in rule else rule


def type_outputs(ctx: GraphCtx, n: Node) -> bool:
    """``infer_local`` for a node with an untyped output, inlined for the ops most nodes are (one output, a rule that
    ``single_output_rule`` gives as data); whether an output of ``n`` is still without a type."""
    outs, ins, types = n.outputs, n.inputs, ctx.types
    rule = (None if not n.onnx_op or len(outs) != 1 else n.to if n.op == "Cast"
            else single_output_rule(n.op, ctx.opset))
    if rule is None:
        infer_local(ctx, n)
        return any(o and o not in types for o in outs)
    t = 0
    if isinstance(rule, int):
        t = rule
    else:
        for j in rule:
            if j < len(ins) and ins[j]:
                t = ctx.type_of(ins[j])
                if t:
                    break
    if t:
        types[outs[0]] = t
    return not t


def infer_local(ctx: GraphCtx, n: Node) -> None:
    """Element-type facts for ``n``'s outputs from this graph alone (complementing value_info): Cast, Constant, shape
    ops, data movement, and for every other default-domain op what its schema implies (``output_types``)."""
    if not n.onnx_op or not n.outputs:
        return
    out, types = n.outputs[0], ctx.types
    if not out or out in types:  # value_info (or an earlier fact) already says
        _schema_types(ctx, n)
        return
    if n.op == "Cast":
        if n.to is not None:
            types[out] = n.to
    elif n.op in ("Shape", "Size"):
        types[out] = TensorProto.INT64
    elif n.op == "Constant":
        a = n.attr("value")
        if a is not None and a.type == AttributeProto.TENSOR:
            types[out] = a.t.data_type
        elif n.attr("value_float") is not None or n.attr("value_floats") is not None:
            types[out] = TensorProto.FLOAT
        elif n.attr("value_int") is not None or n.attr("value_ints") is not None:
            types[out] = TensorProto.INT64
    elif n.op in DATA_MOVEMENT and n.inputs and n.inputs[0]:
        t = ctx.type_of(n.inputs[0])
        if t:
            types[out] = t
    else:
        _schema_types(ctx, n)


def _schema_types(ctx: GraphCtx, n: Node) -> None:
    types = ctx.types
    if n.op == "Constant" or all(not o or o in types for o in n.outputs):
        return
    found = output_types(n.op, n.domain, ctx.opset, n.inputs, ctx.type_of, len(n.outputs))
    for o, t in zip(n.outputs, found, strict=True):
        if o and t and o not in types:
            types[o] = t


def needs_inference(ctx: GraphCtx) -> bool:
    """Shape inference could type a value that the local facts leave untyped: a node onnx knows, whose inputs all have
    known types, has an output without one (an attribute-typed op such as ConstantOfShape, a non-default domain onnx
    defines). Where an input's type is unknown, inference knows no more than these facts (it types by the same
    constraints); an op onnx does not know, it cannot type at all."""
    types = ctx.types
    for n in ctx.untyped:  # an unsorted node list: a producer listed later is typed by now
        infer_local(ctx, n)
    for n in ctx.untyped:
        if all(not o or o in types for o in n.outputs):
            continue
        if all(not i or ctx.type_of(i) for i in n.inputs) and (n.onnx_op or _onnx_knows(n.op, n.domain)):
            return True
    return False


def _onnx_knows(op: str, domain: str) -> bool:
    try:
        return bool(onnx.defs.has(op, domain))
    except Exception:
        return False
