"""Which nodes of a graph stay in fp32 when it is converted to fp16/bf16 (pure decision, no graph edits).

TensorRT 11 and TensorRT-RTX networks are strongly typed, so an engine's precision is the precision of its ONNX
tensors. Converting everything overflows or loses too much: an RMSNorm written as ``Pow -> ReduceMean -> Add ->
Sqrt -> Div`` overflows fp16 once activations pass ~256, a Softmax loses its normaliser, and rotary angles
``position * inv_freq`` lose whole radians in fp16 once positions pass ~1000. The policy:

1. ``KEEP_OPS`` (norms, softmax, reductions, Pow/Exp/Log/Sqrt/Reciprocal/Erf, Sin/Cos, ...) run in fp32; so does
   a square written ``Mul(x, x)``, which is ``Pow(x, 2)``.
2. ``Cast`` nodes keep their ``to`` type, ``CastLike`` nodes their target's (a float32 target stays float32: an
   int32 -> float16 cast overflows where int32 -> float32 does not), and so do the ops whose output type an
   attribute sets (``dtype`` of ``EyeLike``, ``RandomNormal(Like)``, ``RandomUniform(Like)``, ``Bernoulli``;
   ``output_dtype`` of ``DequantizeLinear``), or its default (``RandomNormal``, ``RandomUniform``: float32):
   converted, the output was declared low while the op still made float32. Values computed only from shapes
   (``Shape``/``Range`` and what derives from them: positions, causal masks) form *index* chains; float32 tensors on
   them (``Cast(int -> float)``, ``Where(mask, 0, -inf)``) stay fp32, so exporter constant-folding cannot flip the
   decision.
3. fp32 propagates forward: a node whose non-constant float inputs (at least one) all come from fp32 nodes stays
   fp32; through heavy ops (MatMul, Gemm, Conv, Einsum) only along index chains, so a fused LayerNormalization does
   not drag the next projection into fp32. A ``Div`` whose divisor comes from an fp32 node (a norm's denominator)
   stays fp32, and for fp16 so does a ``Mul`` by a ``Reciprocal``'s output, by ``constant / that denominator`` or
   by a ``Pow`` of it to an exponent not proven non-negative (``negative``, ``fp16_range.negative_exponents``: a
   constant, or one computed from constants such as ``Cast`` / ``Neg`` / ``Reshape`` of one, is evaluated exactly;
   an exponent from a graph input or one that cannot be evaluated counts as negative)
   (``x * rsqrt(mean(x^2) + eps)``, which torch exports as ``Div(1, Sqrt(...))`` and other exporters as
   ``Pow(mean(x^2) + eps, -0.5)``: 1 / rms is beyond fp16's range for a near-zero row when eps is small). A ``Pow``
   to an exponent proven non-negative is no reciprocal.
4. Constant subgraphs (every input an initializer or Constant, e.g. ``Unsqueeze(inv_freq)``) stay fp32 and count
   as constants for rule 3, so ``positions * Unsqueeze(inv_freq)`` stays on the fp32 index chain.
5. Everything else with float32 tensors runs in the low type, if its ONNX schema allows that type; ops without a
   schema (custom domains) and ops with subgraphs stay fp32 and untouched.
6. trtforge plugin nodes (``LoRAOpPluginDynamic``) follow their op contract, not a schema: a float32 one runs in the
   low type with x, y, lora_a, lora_b converted together (scales stay float32, slot ids int32); one already in a
   16-bit type stays in it (details in ``precision_plugins``).
7. A node whose float32 output a subgraph (If/Loop/Scan body) reads from the outer scope stays fp32: the body is
   not converted and still expects float32 (a converted producer made the model invalid).
8. fp16 only: a node with a float32 constant input holding a finite value beyond +-65504 (``wide``; a float64
   one the model casts to float32 counts, and so does a constant subgraph of one, ``Neg(1e5)``) stays fp32:
   clipping the constant would change the result (``x * 1e5``). What it computes may lie beyond that range too (a
   padding mask ``(1 - m) * finfo(float32).min``), so every node reading it stays fp32 as well, and so on, up to an
   op whose output is bounded (``_BOUNDED``: Softmax, norms, Sigmoid, ...): ``scores + mask`` converted to fp16 read
   the mask as -inf (NaN out of Softmax for a row with every key masked).
9. ``Identity`` is a copy: it stays in its input's type and never makes a later node fp32 by itself. Converted, a
   pass-through ``y = Identity(x)`` of a float32 input and output rounded y through the low type (70000 -> inf in
   fp16); between two low nodes it now reads through an exact low -> fp32 -> low round trip, which the fold after
   conversion removes, so the converted graph is the same as before there.
10. fp16 only: a node with a small float32 constant input whose every nonzero value fp16 rounds to zero (``tiny``:
    an epsilon of 1e-12 or 1e-8) stays fp32: ``x * x + 1e-12`` in fp16 adds 0, so the ``Sqrt`` / ``Div`` after it
    made 0 / 0 = NaN where fp32 gave 0. Only the reading node: its result is in range, so nothing spreads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

import onnx
from onnx import NodeProto, TensorProto

from trtforge.plugins import is_plugin_node
from trtforge.plugins.lora import precision as precision_plugins
from trtforge.plugins.lora import spec

from ..core.errors import InputError

FLOAT = TensorProto.FLOAT
LOW_TYPES = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}

KEEP_OPS: frozenset[str] = frozenset({
    "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "RMSNormalization", "GroupNormalization", "InstanceNormalization",
    "BatchNormalization", "LpNormalization", "MeanVarianceNormalization",
    "Softmax", "LogSoftmax",
    "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
    "ReduceProd", "CumSum", "GlobalAveragePool", "AveragePool", "GlobalLpPool", "LpPool",  # pooling: reductions too
    "Pow", "Exp", "Log", "Sqrt", "Reciprocal", "Erf",
    "Sin", "Cos", "Range",
})
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                                "Multinomial", "Bernoulli", "Dropout"})
HEAVY_OPS: frozenset[str] = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulInteger"})
# Ops whose float output lies within fp16's range whatever their input (rule 8's spread stops there).
_BOUNDED: frozenset[str] = frozenset({
    "Softmax", "Sigmoid", "Tanh", "Erf", "Sin", "Cos", "HardSigmoid", "Softsign", "LayerNormalization",
    "SimplifiedLayerNormalization", "RMSNormalization", "GroupNormalization", "InstanceNormalization",
    "LpNormalization", "MeanVarianceNormalization",
})


class Mode(Enum):
    LOW = "low"          # compute in fp16/bf16: float32 inputs are cast down, float32 outputs become low
    KEEP = "keep"        # compute in fp32: low inputs that were float32 are cast back up
    UNTOUCHED = "untouched"  # no float32 tensors involved (or already low): leave as is


@dataclass(frozen=True)
class NodeDecision:
    mode: Mode
    # Indices of inputs that share the node's float type constraint (converted together with the outputs).
    float_inputs: tuple[int, ...] = ()
    reason: str = ""


def _schema(node: NodeProto, opset: Mapping[str, int]) -> onnx.defs.OpSchema | None:
    domain = node.domain if node.domain not in ("", "ai.onnx") else ""
    version = opset.get(domain)
    if version is None:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, version, domain)
    except Exception:  # onnx.defs.SchemaError: unknown op / domain
        return None


def _formal_type_strs(schema: onnx.defs.OpSchema, n_inputs: int) -> list[str]:
    formals = list(schema.inputs)
    out = []
    for i in range(n_inputs):
        f = formals[min(i, len(formals) - 1)] if formals else None
        out.append(f.type_str if f is not None else "")
    return out


def _low_constraint(schema: onnx.defs.OpSchema, node: NodeProto, types: Mapping[str, int],
                    low: int) -> tuple[tuple[int, ...], bool] | None:
    """Inputs bound to the type constraint of the node's float32 tensors, and whether outputs share it.

    None when the float32 tensors' constraint does not admit the low type (then the node must stay fp32).
    """
    low_str = "tensor(float16)" if low == TensorProto.FLOAT16 else "tensor(bfloat16)"
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    in_strs = _formal_type_strs(schema, len(node.input))
    params: set[str] = set()
    for i, name in enumerate(node.input):
        if name and types.get(name) == FLOAT:
            params.add(in_strs[i])
    out_formals = list(schema.outputs)
    for j, name in enumerate(node.output):
        if name and types.get(name) == FLOAT and out_formals:
            params.add(out_formals[min(j, len(out_formals) - 1)].type_str)
    if not params:
        return (), False
    for p in params:
        if p not in allowed or low_str not in allowed[p]:
            return None
    idx = tuple(i for i, name in enumerate(node.input) if name and in_strs[i] in params)
    return idx, True


def decide(model: onnx.ModelProto, types: Mapping[str, int], constants: set[str], to: str,
           keep_ops: frozenset[str] = KEEP_OPS, wide: frozenset[str] = frozenset(),
           tiny: frozenset[str] = frozenset(), negative: frozenset[str] = frozenset(),
           subgraph_reads: bool = True) -> dict[int, NodeDecision]:
    """Decide a Mode for each top-level node (by index, in topological order); ``subgraph_reads=False``: no rule 7."""
    low = LOW_TYPES[to]
    opset = {o.domain if o.domain != "ai.onnx" else "": o.version for o in model.opset_import}
    fp32_origin: dict[str, str] = {}   # value name -> "index" | "norm" | "reciprocal"
    out: dict[int, NodeDecision] = {}
    index_values: set[str] = set()  # non-float values computed from shapes (Shape, Range, comparisons of those)
    constants = set(constants)  # grows with constant subgraphs (e.g. Unsqueeze(inv_freq))
    captured = _subgraph_reads(model.graph.node) if subgraph_reads else set()
    wide_values = set(wide)  # rule 8: the constants, then what nodes kept for them compute (up to a bounded op)
    tiny_values = set(tiny)  # rule 10: the constants, and constant subgraphs of them (Cast of a double literal)
    for idx, node in enumerate(model.graph.node):
        if _constant_subgraph(node, constants, tiny_values, wide_values, types):
            out[idx] = NodeDecision(Mode.KEEP, reason="constant subgraph")
            continue
        dyn_all = [n for n in node.input if n and n not in constants]
        from_index = node.op_type in ("Shape", "Size") or (
            bool(dyn_all) and all(n in index_values or fp32_origin.get(n) == "index" for n in dyn_all))
        if from_index:
            index_values.update(n for n in node.output if n and types.get(n) not in FLOAT_TYPES)
        has_f32 = any(types.get(n) == FLOAT for n in [*node.input, *node.output] if n)
        if not has_f32:
            out[idx] = NodeDecision(Mode.UNTOUCHED, reason="no float32 tensors")
            continue
        if node.op_type == "Constant":  # low consumers get a converted copy; fp32 consumers keep the original
            out[idx] = NodeDecision(Mode.KEEP, reason="constant")
            continue
        if node.op_type in ("Cast", "CastLike"):
            out[idx] = _cast_decision(node, types, fp32_origin)
            continue
        if node.op_type == "Identity":  # rule 9
            out[idx] = _copy_decision(node, fp32_origin)
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            out[idx] = NodeDecision(Mode.KEEP, reason="has subgraphs (not converted)")
            _mark(node, types, fp32_origin, "norm")
            continue
        if is_plugin_node(node):
            out[idx] = _plugin_or_captured(node, types, low, captured, fp32_origin)
            continue
        why = _forced_fp32(node, types, captured, wide_values, tiny_values, opset)
        if why:
            out[idx] = NodeDecision(Mode.KEEP, reason=why)
            _mark(node, types, fp32_origin, "norm")
            if node.op_type not in _BOUNDED and any(n in wide_values for n in node.input):  # rule 8 (or 7 first)
                wide_values.update(n for n in node.output if n and types.get(n) == FLOAT)
            continue
        schema = _schema(node, opset)
        if schema is None:
            out[idx] = NodeDecision(Mode.KEEP, reason="no ONNX schema (custom op): kept fp32")
            _mark(node, types, fp32_origin, "norm")
            continue
        decision, origin = _schema_decision(node, schema, types, constants, fp32_origin, to, keep_ops, from_index)
        out[idx] = decision
        if origin is not None:
            _mark(node, types, fp32_origin, "reciprocal" if _negative_power(node, origin, negative) else origin)
    return out


def _copy_decision(node: NodeProto, fp32_origin: dict[str, str]) -> NodeDecision:
    """Rule 9: an Identity stays in its input's type; its output's fp32 tag is its input's (none if converted)."""
    if node.input[0] in fp32_origin:
        fp32_origin[node.output[0]] = fp32_origin[node.input[0]]
    return NodeDecision(Mode.KEEP, reason="a copy (converting it would only round)")


def _cast_decision(node: NodeProto, types: Mapping[str, int], fp32_origin: dict[str, str]) -> NodeDecision:
    """Rule 2: a Cast (CastLike: to its second input's type) keeps its target; a float32 one tags its output."""
    src = types.get(node.input[0])
    dst = (next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast"
           else types.get(node.input[1]))
    if dst == FLOAT:
        tag = "index" if src is not None and src not in FLOAT_TYPES else fp32_origin.get(node.input[0], "norm")
        fp32_origin[node.output[0]] = tag
    return NodeDecision(Mode.KEEP, reason="Cast keeps its target type")


def _fp32_by_attribute(node: NodeProto, opset: Mapping[str, int]) -> bool:
    """Whether an attribute of the node's schema that sets its output type (``dtype``, ``output_dtype``) is float32
    on the node, or unset with a float32 default (``RandomNormal``, ``RandomUniform``)."""
    schema = _schema(node, opset)
    for name in ("dtype", "output_dtype"):
        if schema is None or name not in schema.attributes:
            continue
        given = next((a.i for a in node.attribute if a.name == name), None)
        default = schema.attributes[name].default_value
        if (given if given is not None else default.i if default.HasField("i") else None) == FLOAT:
            return True
    return False


def _schema_decision(node: NodeProto, schema: onnx.defs.OpSchema, types: Mapping[str, int], constants: set[str],
                     fp32_origin: Mapping[str, str], to: str, keep_ops: frozenset[str],
                     from_index: bool) -> tuple[NodeDecision, str | None]:
    """The decision for a node with an ONNX schema, and the origin tag its fp32 outputs get (None: converted)."""
    dynamic = [n for n in node.input if n and n not in constants and types.get(n) in FLOAT_TYPES]
    origins = [fp32_origin.get(n) for n in dynamic]
    all_fp32 = bool(dynamic) and all(o is not None for o in origins)
    is_index = all_fp32 and all(o == "index" for o in origins)
    # Reciprocal(d), or constant / d (torch exports rsqrt as Div(1, Sqrt(...))): a reciprocal for the Mul rule below
    recip = node.op_type == "Reciprocal" or (node.op_type == "Div" and node.input[0] in constants)
    tag = "index" if is_index else "reciprocal" if recip else "norm"
    if node.op_type in keep_ops or _is_square(node, keep_ops):
        return NodeDecision(Mode.KEEP, reason="numerically sensitive op"), tag
    if from_index:
        return NodeDecision(Mode.KEEP, reason="computed from shapes / positions"), "index"
    if all_fp32 and (node.op_type not in HEAVY_OPS or is_index):
        return NodeDecision(Mode.KEEP, reason="inputs computed in fp32"), tag
    if node.op_type == "Div" and len(node.input) > 1 and node.input[1] in fp32_origin:
        return NodeDecision(Mode.KEEP, reason="divides by an fp32 (norm) denominator"), tag
    if to == "fp16" and node.op_type == "Mul" and any(fp32_origin.get(n) == "reciprocal" for n in node.input):
        # x * rsqrt(mean(x^2) + eps) is x / sqrt(...): 1 / rms of a near-zero row is beyond fp16 (1e6 for eps 1e-12)
        return NodeDecision(Mode.KEEP, reason="multiplies by an fp32 reciprocal (a norm's 1 / rms)"), "norm"
    if _non_tensor_io(schema):  # a sequence / optional has no Cast: converting its elements made the model invalid
        return NodeDecision(Mode.KEEP, reason="reads or writes a sequence / optional (not converted)"), "norm"
    bound = _low_constraint(schema, node, types, LOW_TYPES[to])
    if bound is None:
        return NodeDecision(Mode.KEEP, reason=f"schema does not allow {to}"), "norm"
    return NodeDecision(Mode.LOW, float_inputs=bound[0], reason="converted"), None


def _non_tensor_io(schema: onnx.defs.OpSchema) -> bool:
    """Whether an input or output of the op is a sequence, optional or map (``SequenceConstruct``, ``SequenceAt``,
    ``Optional``...): its float elements cannot be cast, so the node keeps the source's types."""
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    for formal in [*schema.inputs, *schema.outputs]:
        strs = allowed.get(formal.type_str, [formal.type_str])
        if strs and not any(t.startswith("tensor(") for t in strs):
            return True
    return False


def _negative_power(node: NodeProto, origin: str, negative: frozenset[str]) -> bool:
    """Whether an fp32 ``Pow(d, e)`` (not on an index chain) has an exponent not proven non-negative (``negative``):
    a reciprocal of d for rule 3's Mul (``Pow(var + eps, -0.5)`` is ``rsqrt(var + eps)``)."""
    return node.op_type == "Pow" and origin == "norm" and len(node.input) > 1 and node.input[1] in negative


def _is_square(node: NodeProto, keep_ops: frozenset[str]) -> bool:
    """``Mul(x, x)`` is ``Pow(x, 2)`` (rule 1): an RMSNorm exported as ``x * x -> ReduceMean`` squared in fp16 gave
    inf for |x| > 256, so the norm returned 0."""
    return node.op_type == "Mul" and "Pow" in keep_ops and len(node.input) == 2 and node.input[0] == node.input[1]


def _plugin_or_captured(node: NodeProto, types: Mapping[str, int], low: int, captured: set[str],
                        fp32_origin: dict[str, str]) -> NodeDecision:
    """Rule 6, unless rule 7 holds: a plugin node whose float32 output a subgraph reads stays float32 (the body is
    not converted: it would read a 16-bit value as float32)."""
    decision = _plugin_decision(node, types, low)
    if decision.mode is Mode.LOW and any(n in captured and types.get(n) == FLOAT for n in node.output):
        _mark(node, types, fp32_origin, "norm")
        return NodeDecision(Mode.KEEP, reason="output read inside a subgraph (not converted)")
    return decision


def _plugin_decision(node: NodeProto, types: Mapping[str, int], low: int) -> NodeDecision:
    """Rule 6. x, y, lora_a, lora_b are bound to one dtype D; scales (float32) and slot ids (int32) never change."""
    where = f"{node.op_type} node {node.name or node.output[0]!r}"
    if len(node.input) != len(spec.INPUT_NAMES):
        raise InputError(f"{where} has {len(node.input)} inputs; expected {len(spec.INPUT_NAMES)} "
                         f"({', '.join(spec.INPUT_NAMES)}); re-run trtforge lora inject on the original model")
    d = precision_plugins.plugin_dtype(node, types)
    if d in (FLOAT, low):
        return NodeDecision(Mode.LOW, float_inputs=(spec.X, spec.Y, spec.LORA_A, spec.LORA_B),
                            reason="plugin op in the low type")
    if d in FLOAT_TYPES and d != TensorProto.DOUBLE:
        mixed = [spec.INPUT_NAMES[i] for i in (spec.X, spec.Y) if types.get(node.input[i]) == FLOAT]
        if mixed:
            raise InputError(f"{where} has {precision_plugins.dtype_name(d)} adapter pools but float32 "
                             f"{' and '.join(mixed)}; re-run trtforge lora inject on the fp32 model, then convert")
        return NodeDecision(Mode.UNTOUCHED, reason=f"plugin op already {precision_plugins.dtype_name(d)}")
    raise InputError(f"{where}: cannot tell its float dtype (lora_a is {precision_plugins.dtype_name(d)}); "
                     f"declare lora_a as float32, float16 or bfloat16")


#: rule 8's reason (``trtforge quantize`` int4-wo, which quantizes no activation, does not apply it to projections)
WIDE_REASON = "reads a value beyond the fp16 range (a constant, or computed from one)"
_WIDE = WIDE_REASON


def _constant_subgraph(node: NodeProto, constants: set[str], tiny: set[str], wide: set[str],
                       types: Mapping[str, int]) -> bool:
    """Whether every input of ``node`` is a constant (rule 4): TensorRT folds it; leaving it in fp32 keeps e.g. rotary
    inv_freq exact, and its low consumers get a Cast of the folded value. Its outputs join ``constants``, ``tiny``
    when it reads a tiny constant (rule 10: ``Cast`` of a double epsilon), and ``wide`` (its float outputs) when it
    reads a wide one and is not bounded (rule 8: ``Neg(1e5)``, ``Cast`` of a double -1e9 mask value)."""
    if not node.input or node.op_type in _NONDETERMINISTIC or not all(not n or n in constants for n in node.input):
        return False
    constants.update(n for n in node.output if n)
    if any(n in tiny for n in node.input):
        tiny.update(n for n in node.output if n)
    if node.op_type not in _BOUNDED and any(n in wide for n in node.input):
        wide.update(n for n in node.output if n and types.get(n) in (FLOAT, TensorProto.DOUBLE))
    return True


def _forced_fp32(node: NodeProto, types: Mapping[str, int], captured: set[str], wide: set[str],
                 tiny: set[str], opset: Mapping[str, int]) -> str:
    """Rules 2 (an attribute sets the output type), 7, 8 and 10: why the node must stay fp32 ("" when none applies)."""
    if _fp32_by_attribute(node, opset):  # its attribute, not its inputs, makes the output float32
        return "its dtype attribute makes it float32"
    if any(n in captured and types.get(n) == FLOAT for n in node.output):
        return "output read inside a subgraph (not converted)"
    if any(n in wide for n in node.input):
        return _WIDE
    if any(n in tiny for n in node.input):
        return "reads a constant fp16 rounds to zero (an epsilon)"
    return ""


def _subgraph_reads(nodes: Iterable[NodeProto], nested: bool = False) -> set[str]:
    """Value names read inside the nodes' subgraphs (at any depth; ``nested``: the nodes are a subgraph's)."""
    names: set[str] = set(n for node in nodes for n in node.input) if nested else set()
    for node in nodes:
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _subgraph_reads(sub.node, nested=True)
    return names


def _mark(node: NodeProto, types: Mapping[str, int], fp32_origin: dict[str, str], tag: str) -> None:
    for name in node.output:
        if name and types.get(name) == FLOAT:
            fp32_origin[name] = tag
