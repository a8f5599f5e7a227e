"""Which MatMuls are quantized, and why every other one stays float (pure decision, no graph edits).

A candidate is a top-level ``MatMul`` whose second input is a 2-D float32 initializer (a projection weight
``[in, out]``; ``quantizer`` first turns a weight given by a ``Constant`` node into one) and whose first input is a
runtime float32 tensor. ``Gemm`` nodes (a ``transB=1`` Linear exported with 2-D inputs) are not seen here: ``quantizer``
lowers those it can to MatMul + Add first (``gemm``) and reports the others as excluded; a MatMul reading
``Transpose(W)`` of a 2-D float32 initializer (``x @ W.T``, a tied LM head) reads a ``W^T`` initializer once
``quantizer`` has rewritten it (``gemm.untranspose``), for the MatMuls it then quantizes. A MatMul whose weight is
computed at run time otherwise (another op of an initializer, when the fold leaves it) is not a projection here either;
it, and a MatMul whose constant is its first input, 3-D or not float32, is reported as excluded with that reason.
Activation x activation MatMuls (attention scores, probabilities x values) are never candidates (nor listed). A
candidate stays float when:

1. the precision policy (``precision.convert.node_decisions``, the one ``trtforge precision`` uses) does not run it in
   the low type: it sits on a shape/index chain or position arithmetic, or consumes only fp32-kept values, or
   reads an activation computed from a constant beyond fp16's range (a mask sentinel would set its per-tensor
   scale; not for int4-wo, whose activations stay float); its own weight beyond +-65504 does not keep it float
   (per-channel float32 scales store it), nor does an If/Loop/Scan body reading its output (Q/DQ keep every
   output's type);
2. it is the LM head, unless ``quantize_lm_head``: a MatMul from which a graph output is reached through
   data-movement ops and bias Adds only (a lowered Gemm's, or an Add of an initializer), where that output's declared
   last dim, when known, is the MatMul's out features (a ``v_proj`` reshaped into a ``present`` KV output is not a
   head); or a MatMul onto the vocabulary (weight ``[H, V]`` for the largest embedding table ``[V, H]``, a ``Gather``
   of a 2-D initializer) from which a graph output is reached through ops other than MatMul/Gemm that read no other
   run-time value (logits post-processed before the output: temperature, soft-capping, Softmax, ArgMax);
3. its name matches an ``--exclude`` pattern (an unnamed node's name is its label in the source, ``MatMul#7`` for
   node 7; ``quantizer`` names the copies so, and the output model keeps those names).

A weight initializer that is also listed in ``graph.input`` is only a default the caller may override at run time
(ONNX IR < 4 style): it is not a constant, so its MatMul is never a candidate (quantizing it would silently ignore
the fed value); it is reported as excluded.

A ``Conv``, ``ConvTranspose``, ``DeformConv``, ``Einsum``, ``LSTM``, ``GRU`` or ``RNN`` with a float32 constant
operand (an initializer or a ``Constant``) is never quantized; each is reported as excluded with that reason, as is
every weighted layer (MatMul, Gemm, those) inside an If/Loop/Scan body or a model-local function, which is never
quantized either, so the report lists every weighted layer that stays float.

Norms, softmax, rotary Sin/Cos, reductions and ``LoRAOpPluginDynamic`` nodes are not MatMuls, so they are never
touched; a plugin's inputs (x, y, adapter pools, slot ids, scales) are never rewired either: only the MatMul's own
input edge gets the Q/DQ pair (see ``qdq``), so a LoRA node after a quantized projection still reads the float x.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from onnx import GraphProto, ModelProto, NodeProto, TensorProto

from trtforge.plugins.lora import spec as lora_spec

from ..core.errors import InputError
from ..passes.protos import constant_node_tensor
from ..precision.convert import node_decisions
from ..precision.policy import WIDE_REASON, Mode

# the bias Add of a lowered Gemm (``gemm.GEMM_BIAS_DOC``; defined here, which ``gemm`` imports, to avoid a cycle)
GEMM_BIAS_DOC = "trtforge.quantize: the bias Add of a lowered Gemm"
# weighted layers with a float32 initializer operand that are never quantized here: listed as excluded, not silent
_UNQUANTIZED_WEIGHTED = frozenset({"Conv", "ConvTranspose", "DeformConv", "Einsum", "LSTM", "GRU", "RNN"})
_DATA_MOVEMENT = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"})


@dataclass(frozen=True)
class Target:
    """One quantized projection: ``x`` (activation edge), ``weight`` initializer ``[in, out]``."""

    index: int
    name: str
    x: str
    weight: str
    in_features: int
    out_features: int


@dataclass(frozen=True)
class Excluded:
    name: str
    reason: str


@dataclass(frozen=True)
class Selection:
    targets: tuple[Target, ...]
    excluded: tuple[Excluded, ...]


def _matches(name: str, patterns: Sequence[str]) -> str | None:
    """The first pattern ``name`` matches: an fnmatch glob when it holds ``*?[``, else a substring whose numbers
    match whole (``layers.1`` is not in ``layers.10.q_proj``, ``MatMul#1`` not in ``MatMul#12``)."""
    for p in patterns:
        if any(c in p for c in "*?["):
            hit = fnmatch.fnmatchcase(name, p)
        else:
            lead = r"(?<!\d)" if p[:1].isdigit() else ""
            tail = r"(?!\d)" if p[-1:].isdigit() else ""
            hit = re.search(lead + re.escape(p) + tail, name) is not None
        if hit:
            return p
    return None


def _check_patterns(model: ModelProto, patterns: Sequence[str]) -> None:
    from ..core.graph import all_graphs

    labels = [node_label(n, i) for i, n in enumerate(model.graph.node)]
    # the report's labels of layers in bodies and functions too (they stay float; naming one is no typo)
    labels += [node_label(n, i) for g in [*list(all_graphs(model.graph))[1:], *model.functions]
               for i, n in enumerate(g.node)]
    for p in patterns:
        if not any(_matches(label, (p,)) for label in labels):
            sample = ", ".join(repr(x) for x in [n for n in labels if n][:3])
            raise InputError(f"--exclude {p!r} matches no node name (they read like {sample}); check the spelling: "
                             "a pattern is a substring of a name (numbers in it match whole), or an fnmatch glob "
                             "with * ? [")


def _is_bias(node: NodeProto, value: str, inits: Collection[str]) -> bool:
    """A lowered Gemm's bias Add, or an Add of ``value`` and an initializer (a projection's bias)."""
    if node.op_type != "Add" or len(node.input) != 2:
        return False
    other = node.input[1] if node.input[0] == value else node.input[0]
    return node.doc_string == GEMM_BIAS_DOC or other in inits


def _lm_heads(model: ModelProto) -> set[str]:
    """Outputs of the MatMuls that are the LM head (module docstring, rule 2)."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, list[NodeProto]] = {}
    for node in g.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    out_dim = {o.name: (o.type.tensor_type.shape.dim[-1].dim_value if o.type.tensor_type.shape.dim else 0)
               for o in g.output}
    shapes = [(int(inits[n.input[0]].dims[1]), int(inits[n.input[0]].dims[0])) for n in g.node
              if n.op_type == "Gather" and n.input[0] in inits and len(inits[n.input[0]].dims) == 2]
    # the vocabulary is the largest table: position / token-type tables are smaller (BERT-medium: 512 positions,
    # hidden 512, so every [512, 512] projection would match a position table)
    top = max((v for _, v in shapes), default=0)
    tables = {hv for hv in shapes if hv[1] == top}
    constants = set(inits) | {n.output[0] for n in g.node if n.op_type == "Constant"}
    heads: set[str] = set()
    for node in g.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or len(w.dims) != 2:
            continue
        # onto the vocabulary: [H, V] against an embedding table [V, H] (a rotary cache [positions, head_dim] whose
        # rows equal a v_proj's out features is no vocabulary: its width is not the projection's in features)
        features, onto_vocab = int(w.dims[1]), (int(w.dims[0]), int(w.dims[1])) in tables
        frontier, seen = [node.output[0]], set[str]()
        while frontier:
            value = frontier.pop()
            if value in seen:
                continue
            seen.add(value)
            if value in out_dim and (onto_vocab or out_dim[value] in (0, features)):
                heads.add(node.output[0])
                break
            for nxt in consumers.get(value, []):
                movement = nxt.op_type in _DATA_MOVEMENT or lora_spec.is_lora_node(nxt) or _is_bias(nxt, value, inits)
                # logits post-processing reads one value at run time (not a residual Add of two activations)
                post = all(not i or i == value or i in constants for i in nxt.input)
                if movement or (onto_vocab and post and nxt.op_type not in ("MatMul", "Gemm")):
                    frontier.extend(nxt.output)
    return heads


def _not_a_projection(node: NodeProto, inits: dict[str, TensorProto], producers: dict[str, NodeProto],
                      consts: set[str]) -> str | None:
    """Why a MatMul with a constant operand is not a candidate (None: no constant operand, or both constant).
    ``consts``: the float32 initializers and ``Constant`` outputs (a weight an exporter wrote as a Constant node)."""
    a, b = (inits.get(name) for name in node.input)
    a_const = a is not None or node.input[0] in consts
    if a_const and b is None and node.input[1] not in consts:
        return "its constant is the first input (W @ x); only x @ W with W [in, out] is quantized"
    if b is not None and not a_const:
        if b.data_type != TensorProto.FLOAT:
            name = TensorProto.DataType.Name(b.data_type).lower()
            return f"its weight {b.name!r} is {name}, not float32 (quantize the float32 source model)"
        return f"its weight {b.name!r} is {len(b.dims)}-D; only 2-D [in, out] weights are quantized"
    first, src = (_moved_constant(producers.get(name), inits, consts) for name in node.input)
    if not a_const and b is None and src is not None:
        return (f"its weight is computed at run time ({src}); only initializer weights are quantized")
    if first is not None and b is None and node.input[1] not in consts and src is None:  # Transpose(W) @ x
        return f"its constant is the first input (W @ x, {first}); only x @ W with W [in, out] is quantized"
    return None


def _moved_constant(p: NodeProto | None, inits: dict[str, TensorProto], consts: set[str]) -> str | None:
    """``"Transpose of 'w'"`` when ``p`` is a data-movement op (Transpose, Reshape, ...) of a constant; else None."""
    if p is None or p.op_type not in _DATA_MOVEMENT or not p.input or not (p.input[0] in inits or p.input[0] in consts):
        return None
    return f"{p.op_type} of {p.input[0]!r}"


def _nested(model: ModelProto) -> list[Excluded]:
    """The weighted layers inside If/Loop/Scan bodies: never quantized (only the main graph is), so each is listed
    as excluded with that reason (a body's MatMul stayed float and the report did not name it)."""
    from ..core.graph import all_graphs

    graphs = list(all_graphs(model.graph))
    weights = {name for g in graphs for name in _float_constants(g)}
    out = []
    for g in graphs[1:]:
        for i, node in enumerate(g.node):
            weighted = node.op_type in _UNQUANTIZED_WEIGHTED | {"MatMul", "Gemm"} and node.domain in ("", "ai.onnx")
            if weighted and any(x in weights for x in node.input):
                out.append(Excluded(node_label(node, i), f"{node.op_type} inside the subgraph {g.name!r} (an If/Loop/"
                                    "Scan body) is not quantized (only main-graph projections are); it stays float"))
    return out + _in_functions(model, graphs, weights)


def _in_functions(model: ModelProto, graphs: Sequence[GraphProto], outer: set[str]) -> list[Excluded]:
    """The weighted layers of model-local functions (never quantized either): a node reading a float32 Constant of
    the function, or a formal input some call binds to a float32 constant of the calling graph."""
    calls = [n for g in graphs for n in g.node]
    out = []
    for fn in model.functions:
        weights = {n.output[0] for n in fn.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
                   and (t := constant_node_tensor(n)) is not None and t.data_type == TensorProto.FLOAT}
        weights |= {formal for call in calls if (call.domain, call.op_type) == (fn.domain, fn.name)
                    for formal, actual in zip(fn.input, call.input, strict=False) if actual in outer}
        for i, node in enumerate(fn.node):
            weighted = node.op_type in _UNQUANTIZED_WEIGHTED | {"MatMul", "Gemm"} and node.domain in ("", "ai.onnx")
            if weighted and any(x in weights for x in node.input):
                out.append(Excluded(node_label(node, i), f"{node.op_type} inside the model-local function "
                                    f"'{fn.domain}.{fn.name}' is not quantized (only main-graph projections are); it "
                                    "stays float"))
    return out


def _float_constants(g: GraphProto) -> set[str]:
    """The float32 initializers of ``g`` and the outputs of its float32 ``Constant`` nodes (exporters write a body's
    weights, and a Conv's, so): the operands that make a layer weighted."""
    names = {t.name for t in g.initializer if t.data_type == TensorProto.FLOAT}
    for n in g.node:
        value = constant_node_tensor(n) if n.op_type == "Constant" and n.domain in ("", "ai.onnx") else None
        if value is not None and value.data_type == TensorProto.FLOAT:
            names.add(n.output[0])
    return names


def node_label(node: object, index: int) -> str:
    name = getattr(node, "name", "")
    return name or f"{getattr(node, 'op_type', 'node')}#{index}"


@contextlib.contextmanager
def source_labels(model: ModelProto) -> Iterator[None]:
    """Inside: every unnamed top-level node of ``model`` is named with its label in ``model`` (``MatMul#7``), so the
    copies made inside keep the labels a user reads off the source however many nodes the opset conversion, fold or
    Gemm lowering add or remove before ``select``; on exit ``model``'s own nodes are unnamed again."""
    named = [n for n in model.graph.node if not n.name]
    for i, n in enumerate(model.graph.node):
        if not n.name:
            n.name = node_label(n, i)
    try:
        yield
    finally:
        for n in named:
            n.ClearField("name")  # onnx.proto is proto2: name = "" would still be serialised


def select(model: ModelProto, exclude: Sequence[str] = (), quantize_lm_head: bool = False,
           weight_only: bool = False) -> Selection:
    """Targets and excluded candidates of ``model`` (see the module docstring). An ``exclude`` pattern that matches
    no node name is an InputError (a typo would otherwise quantize what it meant to keep). ``weight_only`` (int4-wo:
    activations stay float): an activation beyond fp16's range does not keep a projection float."""
    _check_patterns(model, exclude)
    inits = {t.name: t for t in model.graph.initializer}
    fed = {vi.name for vi in model.graph.input}
    weights = frozenset(n.input[1] for n in model.graph.node if n.op_type == "MatMul" and len(n.input) == 2
                        and n.input[1] in inits and n.input[0] not in inits)
    # weights: stored with float32 scales; a projection's output keeps its type, so an If/Loop body may read it
    decisions = node_decisions(model, "fp16", range_exempt=weights, subgraph_reads=False)
    heads = _lm_heads(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    consts = _float_constants(model.graph)
    targets: list[Target] = []
    excluded: list[Excluded] = []
    for i, node in enumerate(model.graph.node):
        if node.op_type in _UNQUANTIZED_WEIGHTED and node.domain in ("", "ai.onnx"):
            operands = [x for x in node.input if x]
            if any(x in consts for x in operands) and any(x not in consts for x in operands):  # weighted, not handled
                excluded.append(Excluded(node_label(node, i), f"{node.op_type} is not quantized (trtforge quantizes "
                                         "MatMul and Gemm projections only); it stays float"))
            continue
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        w = inits.get(node.input[1])
        label = node_label(node, i)
        if w is None or w.data_type != TensorProto.FLOAT or len(w.dims) != 2 or node.input[0] in inits \
                or node.input[0] in consts:
            why = _not_a_projection(node, inits, producers, consts)
            if why is not None:  # a constant operand that is not an [in, out] float32 weight: reported, kept float
                excluded.append(Excluded(label, why))
            continue  # otherwise activation x activation (attention), or a constant expression
        if w.name in fed:
            excluded.append(Excluded(label, f"its weight {w.name!r} is a graph input (overridable at run time)"))
            continue
        if 0 in w.dims:  # a valid model may hold one; its scales would be maxima over nothing (exit 3)
            excluded.append(Excluded(label, f"its weight {w.name!r} is empty (shape {list(w.dims)}): nothing to "
                                     "quantize"))
            continue
        decision = decisions[i]
        pattern = _matches(label, exclude)
        if decision.mode is not Mode.LOW and not (weight_only and decision.reason == WIDE_REASON):
            excluded.append(Excluded(label, f"precision policy keeps it in float ({decision.reason})"))
        elif node.output[0] in heads and not quantize_lm_head:
            excluded.append(Excluded(label, "LM head (pass --quantize-lm-head to quantize it)"))
        elif pattern is not None:
            excluded.append(Excluded(label, f"--exclude {pattern!r}"))
        else:
            targets.append(Target(i, label, node.input[0], node.input[1], int(w.dims[0]), int(w.dims[1])))
    return Selection(tuple(targets), tuple(excluded + _nested(model)))
