"""Whether an op's schema, at the model's opset, accepts a node's input types (asked of ``onnx.defs``, not a list).

A rewrite that makes a node read a value of another element type (``sink_cast`` moves a Cast past a Flatten, so the
Flatten now reads the Cast's input) must leave a node the op accepts: Flatten-1 (opsets 1-8) takes only float types,
Gather-1 no bfloat16, every op before opset 13 no bfloat16, and so on. ``accepts`` reads the formal inputs and type
constraints of ``onnx.defs.get_schema(op, opset, domain)`` (the version in force at ``opset``) and checks both that
each input's type is allowed and that inputs bound to one type variable keep one type.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import onnx
from onnx import TensorProto


def type_str(t: int) -> str:
    """``tensor(float16)`` for ``TensorProto.FLOAT16``: the spelling schemas use."""
    return f"tensor({TensorProto.DataType.Name(t).lower()})"


@lru_cache(maxsize=4096)
def _formal(op: str, domain: str, opset: int) -> tuple[tuple[tuple[str, bool], ...], dict[str, frozenset[str]]] | None:
    """((type string or type variable, variadic) per formal input, {type variable: allowed type strings})."""
    try:
        s = onnx.defs.get_schema(op, opset, domain)
    except Exception:  # no such op at this opset / unknown domain: never rewrite into it
        return None
    formals = tuple((i.type_str, i.option == onnx.defs.OpSchema.FormalParameterOption.Variadic) for i in s.inputs)
    constraints = {c.type_param_str: frozenset(c.allowed_type_strs) for c in s.type_constraints}
    return formals, constraints


@lru_cache(maxsize=512)
def output_holds(op: str, t: int, opset: int) -> bool:
    """The default-domain ``op``'s schema at ``opset`` allows element type ``t`` for its first output (False when
    there is no such op at that opset)."""
    try:
        s = onnx.defs.get_schema(op, opset, "")
    except Exception:
        return False
    out = s.outputs[0].type_str
    allowed = {c.type_param_str: frozenset(c.allowed_type_strs) for c in s.type_constraints}
    return type_str(t) in allowed.get(out, frozenset({out}))


def constant_holds(t: int, opset: int) -> bool:
    """A ``Constant`` node at ``opset`` may hold a tensor of element type ``t``: Constant-1 (opsets 1-8) holds only
    float16, float and double, bfloat16 comes at 13, float8 at 19. A rewrite that writes a folded value as a node
    asks this first."""
    return output_holds("Constant", t, opset)


def accepts(op: str, domain: str, opset: int, types: Sequence[int]) -> bool:
    """The schema of ``op`` at ``opset`` accepts inputs of element ``types`` (0 = unknown: not checked, but an
    unknown type never proves a type variable consistent)."""
    return _accepts(op, domain, opset, tuple(types))


@lru_cache(maxsize=16384)
def _accepts(op: str, domain: str, opset: int, types: tuple[int, ...]) -> bool:
    """``accepts``, cached: a pure function of its arguments (the schemas of the installed onnx), asked once per
    rewrite candidate, with few distinct arguments in a graph."""
    found = _formal(op, "" if domain == "ai.onnx" else domain, opset)
    if found is None:
        return False
    formals, constraints = found
    bound: dict[str, int] = {}
    for k, t in enumerate(types):
        if not formals:
            return False
        spec, variadic = formals[min(k, len(formals) - 1)]
        if k >= len(formals) and not variadic:
            return False
        if not t:
            continue
        allowed = constraints.get(spec, frozenset({spec}))
        if type_str(t) not in allowed:
            return False
        if spec in constraints and bound.setdefault(spec, t) != t:
            return False
    return True
