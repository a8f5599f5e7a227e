"""The inject pass: put a ``LoRAOpPluginDynamic`` node after each target projection and add the pool inputs.

Targets are matched against each MatMul/Gemm's *module path*, the first of: the weight initializer's name without
``.weight`` (``model.layers.0.self_attn.q_proj``; also through the Transpose/Cast/DequantizeLinear chains exporters
put in front of a weight, and to ``trtforge quantize``'s stored ``<path>.weight_quantized``; not for an embedding
table, also a Gather's data: a tied LM head is ``lm_head`` by what follows, not ``model.embed_tokens``); the module
metadata (torch.onnx's dynamo exporter names nodes ``node_linear_N`` and records the module in ``metadata_props``:
``pkg.torch.onnx.name_scopes`` or ``namespace``);
the node name's folders (``/model/layers.0/self_attn/q_proj/MatMul`` -> ``model.layers.0.self_attn.q_proj``, the
TorchScript exporter). A target matches when it is one dotted component of the path (``q_proj``) or a dotted suffix
of it (``self_attn.q_proj``).

Graph inputs added (names from ``spec.input_name``, the same names ``trtforge lora pack`` writes):
``lora_a.<path>`` [N, H, R] and ``lora_b.<path>`` [N, R, O] in the projection's dtype, ``lora_scales.<path>``
float32 [N] per target (per target so PEFT ``alpha_pattern``/``rank_pattern`` adapters are expressible), and one
shared ``lora_slot_ids`` int32 with the dims of ``x.shape[:-1]`` (per token) or ``[batch]`` (``per_sequence``); a
2-D x's token count that no graph input names is the dim ``lora_tokens`` (``trtforge build``: batch x sequence).

Must not fire (refused with InputError): a Gemm with ``transA``; a MatMul whose constant weight is not 2-D (a vector or
a batched weight is no Linear/Conv1D); a projection whose input is not 2-D or 3-D; a projection already followed by a
plugin node; targets whose inputs would have different leading dims (one shared ``slot_ids`` could not fit them all):
different ranks, an unknown dim, or two different static sizes at one position (the batch position only with
``per_sequence``; dim_params are not compared, since shape inference names equal runtime dims differently); a target
matching a projection inside an If/Loop/Scan body (only the main graph is adapted).

One module applied twice (two MatMuls of one weight, a shared or tied projection) is one module path: both
projections get a plugin node and share its ``lora_a/lora_b/lora_scales`` inputs (PEFT adapts the module, so every
call of it), unless their in/out features or dtypes differ (refused). A model that already holds plugin nodes
(inject run again with other targets) keeps its one ``lora_slot_ids`` input, so the new nodes must use the same
``max_rank``, ``num_slots`` and slot layout (what ``trtforge lora pack --model`` reads as one pool layout); a
``lora_slot_ids`` input in a model without plugin nodes is refused.

A quantized projection (``trtforge quantize``: ``x -> [Mul(1/s)] -> [QuantizeLinear -> DequantizeLinear] ->
MatMul``) is adapted on its float input: the plugin's ``x`` is the value before the migration Mul (marked with
``onnx_io.MIGRATION_DOC``) and the activation Q/DQ pair, because adapters are trained on the float activations.

The MatMul's output is renamed ``<y>.lora_base`` and the plugin's output takes the original name, so every consumer,
graph output and value_info keeps working unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import ModelProto, NodeProto, TensorProto

from trtforge.build_engine.core import steps
from trtforge.build_engine.core.errors import InputError
from trtforge.build_engine.core.graph import all_graphs, tensor_dims
from trtforge.build_engine.core.onnx_io import MIGRATION_DOC

from . import spec
from ._graph import FLOAT_TYPES, DimT, ValueType, make_input, value_types


@dataclass(frozen=True)
class Site:
    """One projection to adapt (pure data: the plan the pass then applies)."""

    node_index: int
    path: str
    x: str
    y: str
    in_features: int
    out_features: int
    elem_type: int
    lead_dims: tuple[DimT, ...]


def _weight_source(name: str, inits: set[str], producer: dict[str, NodeProto]) -> str:
    """The initializer a weight input comes from, through exporter chains (Transpose, Cast, ...); else ``name``."""
    for _ in range(5):
        if name in inits:
            return name
        node = producer.get(name)
        if node is None or node.op_type not in _WEIGHT_PATH_OPS or not node.input:
            return name
        name = node.input[0]
    return name


def metadata_path(node: NodeProto) -> str | None:
    """The module path torch.onnx's exporter recorded on ``node`` (``metadata_props``), or None."""
    import ast

    props = {p.key: p.value for p in node.metadata_props}
    raw = props.get("pkg.torch.onnx.name_scopes")
    if raw:
        try:
            scopes = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            scopes = None
        if isinstance(scopes, list) and len(scopes) > 1:
            modules = [s for s in scopes[:-1] if isinstance(s, str) and s]  # the last entry is the op itself
            if modules:
                return modules[-1]
    namespace = props.get("namespace")
    if namespace:  # ": pkg.Model/layers.0: pkg.Attn/layers.0.q_proj: torch...Linear/linear: aten.linear.default"
        names = [seg.split(":")[0].strip() for seg in namespace.split("/")[:-1]]
        names = [n for n in names if n]
        if names:
            return names[-1]
    return None


# the stored weight ``trtforge quantize`` writes for ``<path>.weight`` (a lowered transB Gemm's ``_transposed`` copy,
# ``Namer``'s ``_N`` suffixes): ``qdq._weight_node`` names it ``<weight>_quantized``
_QUANTIZED_WEIGHT = re.compile(r"^(?P<path>.+)\.weight(?:_transposed(?:_\d+)?)?_quantized(?:_\d+)?$")


def module_path(node: NodeProto, initializers: set[str], producer: dict[str, NodeProto] | None = None,
                tied: frozenset[str] = frozenset()) -> str:
    """The node's module path (module docstring). A weight in ``tied`` (an embedding table, also the data of a
    Gather) belongs to another module than the projection using it, a tied LM head: its module comes from the
    exporter's metadata or node name first (the head was named ``model.embed_tokens``: ``--targets lm_head``
    matched nothing and a PEFT ``lm_head`` adapter could not be packed)."""
    weight = node.input[1] if len(node.input) > 1 else ""
    source = _weight_source(weight, initializers, producer or {})
    by_weight = source[: -len(".weight")] if source in initializers and source.endswith(".weight") else None
    if by_weight is not None and source not in tied:
        return by_weight
    quantized = _QUANTIZED_WEIGHT.match(source) if source in initializers and source != weight else None
    if quantized and source not in tied:  # a quantized weight (behind its DequantizeLinear): the float one's module
        return quantized["path"]
    meta = metadata_path(node)
    if meta:
        return meta
    parts = [p for p in node.name.strip("/").split("/") if p]
    if len(parts) > 1 or parts and by_weight is None:
        return ".".join(parts[:-1] if len(parts) > 1 else parts)
    return by_weight or weight


def _short_name(path: str) -> str:
    """A path's name from its last non-numeric part (``dense.1``, not ``1``: a target matching all of layer 1)."""
    parts = path.split(".")
    return ".".join(parts[max((i for i, p in enumerate(parts) if not p.isdigit()), default=0):])


def _matches(path: str, target: str) -> bool:
    parts = path.split(".")
    return target in parts or path == target or path.endswith("." + target)


def _gemm_attr(node: NodeProto, name: str) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), 0)


_WEIGHT_PATH_OPS = ("Cast", "Identity", "Transpose", "DequantizeLinear", "Reshape")


def _is_constant(name: str, inits: set[str], producer: dict[str, NodeProto], depth: int = 0) -> bool:
    """A weight: an initializer or Constant, possibly through Cast/Transpose/DequantizeLinear (exporter chains)."""
    if name in inits:
        return True
    node = producer.get(name)
    if node is None or depth > 4:
        return False
    if node.op_type == "Constant":
        return True
    return node.op_type in _WEIGHT_PATH_OPS and _is_constant(node.input[0], inits, producer, depth + 1)


def float_input(name: str, producer: dict[str, NodeProto]) -> str:
    """The projection input before trtforge quantize's activation Q/DQ pair and migration Mul (see module doc)."""
    node = producer.get(name)
    if node is not None and node.op_type == "DequantizeLinear":
        q = producer.get(node.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            name, node = q.input[0], producer.get(q.input[0])
    if node is not None and node.op_type == "Mul" and node.doc_string == MIGRATION_DOC:
        name = node.input[0]
    return name


def projections(model: ModelProto) -> list[tuple[int, NodeProto, str]]:
    """MatMul/Gemm nodes whose second input is a constant weight (activation x activation MatMuls are not)."""
    inits = {t.name for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    tied = frozenset(n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input and n.input[0] in inits)
    return _projections_in(model.graph.node, inits, producer, tied)


def _projections_in(nodes: Sequence[NodeProto], inits: set[str], producer: dict[str, NodeProto],
                    tied: frozenset[str]) -> list[tuple[int, NodeProto, str]]:
    return [(i, n, module_path(n, inits, producer, tied)) for i, n in enumerate(nodes)
            if n.op_type in ("MatMul", "Gemm") and n.domain in ("", "ai.onnx") and len(n.input) > 1
            and _is_constant(n.input[1], inits, producer)]


def nested_projection_paths(model: ModelProto) -> list[str]:
    """Module paths of the projections inside If/Loop/Scan bodies (a weight may be a body's or an outer initializer)."""
    bodies = list(all_graphs(model.graph))[1:]
    inits = {t.name for g in (model.graph, *bodies) for t in g.initializer}
    producer = {o: n for g in bodies for n in g.node for o in n.output}
    return [p for g in bodies for _, _, p in _projections_in(g.node, inits, producer, frozenset())]


def plan(model: ModelProto, targets: Sequence[str]) -> list[Site]:
    """Find the sites; raises InputError naming what was found when a target matches nothing."""
    if not targets:
        raise InputError("no LoRA targets given; pass --targets q_proj,v_proj (module names)")
    types = value_types(model)
    inits = {t.name: t for t in model.graph.initializer}
    already = {n.input[1] for n in model.graph.node if spec.is_lora_node(n) and len(n.input) > 1}
    producer = {o: n for n in model.graph.node for o in n.output}
    found, nested = projections(model), nested_projection_paths(model)
    sites: list[Site] = []
    for target in targets:
        hits = [(i, n, p) for i, n, p in found if _matches(p, target)]
        inside = sorted({p for p in nested if _matches(p, target)})
        if inside:  # adapting only the main graph's matches would leave these modules without the adapter
            shown = ", ".join(inside[:4]) + (f" and {len(inside) - 4} more" if len(inside) > 4 else "")
            raise InputError(f"target {target!r} matches projections inside If/Loop/Scan bodies ({shown}), which "
                             "inject does not adapt (main graph only); export the model without control flow (one "
                             "graph per branch) or pass targets that name main-graph modules only")
        if not hits:
            names = sorted({_short_name(p) for _, _, p in found})
            raise InputError(f"target {target!r} matches no MatMul/Gemm projection; projections found: "
                             f"{', '.join(names) or 'none'}")
        for i, node, path in (hit for hit in hits if all(s.node_index != hit[0] for s in sites)):
            sites.append(_site(i, node, path, types, inits, already, float_input(node.input[0], producer)))
    leads = {s.lead_dims for s in sites}
    if len({len(d) for d in leads}) > 1 or len(leads) > 1 and any(None in d for d in leads):
        raise InputError(f"target projections have inputs with different leading dims {sorted(map(str, leads))}; "
                         "one shared lora_slot_ids cannot serve them; choose targets with the same input layout")
    return sorted(sites, key=lambda s: s.node_index)


def _site(i: int, node: NodeProto, path: str, types: dict[str, ValueType], inits: dict[str, TensorProto],
          already: set[str], x: str) -> Site:
    where = f"projection {node.name or path!r}"
    if node.output[0] in already:
        raise InputError(f"{where} already has a {spec.PLUGIN_NAME} node; inject into the original model")
    y = node.output[0]
    if node.op_type == "Gemm" and _gemm_attr(node, "transA"):
        raise InputError(f"{where} is a Gemm with transA=1; LoRA needs x as [tokens, in_features]")
    w = inits.get(node.input[1])
    wt = types.get(node.input[1])
    w_dims = list(w.dims) if w is not None else (list(wt.shape) if wt and wt.shape is not None else None)
    if w_dims is not None and (len(w_dims) < 2 or any(d != 1 for d in w_dims[:-2])):  # [1, H, O] broadcasts
        # x [B, S, H] @ w [H] gave out_features S (a plugin of the wrong shape); w [E, H, O] is no one projection
        raise InputError(f"{where}: its weight {node.input[1]!r} has rank {len(w_dims)} (shape {w_dims}), not a 2-D "
                         "[in, out] projection weight (a Linear or Conv1D: what LoRA adapts); choose other --targets")
    h = o = None
    if w is not None and len(w.dims) == 2:
        h, o = int(w.dims[0]), int(w.dims[1])
        if node.op_type == "Gemm" and _gemm_attr(node, "transB"):
            h, o = o, h
    xt, yt = types.get(x), types.get(y)
    if h is None and xt and xt.shape and isinstance(xt.shape[-1], int):
        h = xt.shape[-1]
    if o is None and yt and yt.shape and isinstance(yt.shape[-1], int):
        o = yt.shape[-1]
    if h is None or o is None:
        raise InputError(f"{where}: cannot tell in/out features (weight is not a 2-D initializer and shapes are "
                         "unknown); run shape inference on the model first")
    elem = (yt.elem_type if yt and yt.elem_type else 0) or (int(w.data_type) if w is not None else 0)
    if elem not in FLOAT_TYPES:
        raise InputError(f"{where} has dtype {onnx.helper.tensor_dtype_to_np_dtype(elem) if elem else 'unknown'}; "
                         f"{spec.PLUGIN_NAME} supports {', '.join(spec.FLOAT_DTYPES)}")
    if xt is None or xt.shape is None or len(xt.shape) not in (2, 3):
        rank = "unknown" if xt is None or xt.shape is None else len(xt.shape)
        raise InputError(f"{where}: input {x!r} must be 2-D or 3-D with a known rank (rank is {rank})")
    return Site(i, path, x, y, h, o, elem, tuple(xt.shape[:-1]))


def _check_static_leads(sites: Sequence[Site], per_sequence: bool) -> None:
    """Two static sizes at one slot_ids position (batch, or batch and sequence per token) cannot share one
    lora_slot_ids: the plugin would refuse the shapes at run time and the decomposed graph would broadcast."""
    for k in range(1 if per_sequence else len(sites[0].lead_dims)):
        sizes = {s.path: s.lead_dims[k] for s in sites if isinstance(s.lead_dims[k], int)}
        if len(set(sizes.values())) > 1:
            raise InputError(f"target projections have inputs of different static sizes at dim {k} "
                             f"({', '.join(f'{p}: {d}' for p, d in sizes.items())}); one shared lora_slot_ids "
                             "cannot serve them; choose targets with the same input layout"
                             + ("" if per_sequence or k == 0 else " or pass --per-sequence"))


def _check_same_module(first: Site, site: Site) -> None:
    """A second projection of one module path shares the first's pool, so it must have the same shapes and dtype."""
    if (first.in_features, first.out_features, first.elem_type) != (site.in_features, site.out_features,
                                                                     site.elem_type):
        raise InputError(f"two projections share module path {site.path!r} but differ in [in, out] features or dtype "
                         f"([{first.in_features}, {first.out_features}] vs [{site.in_features}, {site.out_features}])"
                         "; one LoRA pool per module cannot serve both: name their weights apart")


def _reuse_slot_ids(model: ModelProto, slot_dims: tuple[DimT, ...], max_rank: int, slots: int) -> bool:
    """True when the model already has the shared ``lora_slot_ids`` input of earlier plugin nodes that the new ones
    can share (same rank, slots and slot layout); InputError otherwise (module doc)."""
    existing = next((i for i in model.graph.input if i.name == spec.SLOT_IDS_INPUT), None)
    if existing is None:
        return False
    prior = [n for n in model.graph.node if spec.is_lora_node(n)]
    if not prior:
        raise InputError(f"the model already has an input named {spec.SLOT_IDS_INPUT!r} but no {spec.PLUGIN_NAME} "
                         "nodes; rename that input before injecting")
    attrs = {a.name: a.i for a in prior[0].attribute}
    if (attrs.get("max_rank"), attrs.get("num_slots")) != (max_rank, slots):
        raise InputError(f"the model already has {spec.PLUGIN_NAME} nodes with --max-rank {attrs.get('max_rank')} "
                         f"--slots {attrs.get('num_slots')}; inject again with the same values (one pool layout per "
                         "model) or inject all targets into the original model at once")
    dims = tensor_dims(existing)
    if dims is None or len(dims) != len(slot_dims) or any(
            isinstance(d, int) and isinstance(e, int) and d != e for d, e in zip(dims, slot_dims, strict=True)):
        raise InputError(f"the model's {spec.SLOT_IDS_INPUT} input has dims {list(dims or [])}, but these targets "
                         f"need {list(slot_dims)} (per token or --per-sequence as before); inject with the same "
                         "slot layout")
    return True


def _slot_dims(model: ModelProto, lead: tuple[DimT, ...], per_sequence: bool) -> tuple[DimT, ...]:
    """``lora_slot_ids``' dims: x's leading dims (the batch alone per sequence), an unknown one named
    ``lora_tokens_<k>``; a 2-D x's token count that no graph input names (shape inference's ``unk__N``, or unknown)
    is ``spec.TOKENS_DIM``, which the build sizes batch x sequence (by position it was sized as a batch)."""
    dims = (lead[0],) if per_sequence else lead
    named = {d for i in model.graph.input for d in (tensor_dims(i) or ()) if isinstance(d, str)}
    if len(dims) == 1 and not per_sequence and not isinstance(lead[0], int) and lead[0] not in named:
        return (spec.TOKENS_DIM,)
    return tuple(d if d is not None else f"lora_tokens_{k}" for k, d in enumerate(dims))


@steps.timed("inject")
def inject(model: ModelProto, targets: Sequence[str], max_rank: int, slots: int, *, per_sequence: bool = False,
           tile: int | None = None, inplace: bool = False) -> ModelProto:
    """A new model with a plugin node after each target projection (the input model is not mutated unless
    ``inplace``: then it is the model changed and returned, with no copy of its weights; on an error it may be half
    changed). ``tile`` None writes no tile attribute: ``trtforge build`` then writes its GPU profile's ``[lora]`` tile
    (``set_missing_tiles``), and any other runtime uses ``spec.DEFAULT_TILE``."""
    sites = plan(model, targets)
    lead = sites[0].lead_dims
    if per_sequence and len(lead) != 2:
        raise InputError("--per-sequence needs 3-D projection inputs [batch, sequence, hidden]; these are 2-D")
    _check_static_leads(sites, per_sequence)
    if inplace:
        out = model
    else:
        out = ModelProto()
        out.CopyFrom(model)
    g = out.graph
    taken = {i.name for i in g.input} | {t.name for t in g.initializer}
    slot_dims = _slot_dims(model, lead, per_sequence)
    new_inputs = [] if _reuse_slot_ids(model, slot_dims, max_rank, slots) else [
        make_input(spec.SLOT_IDS_INPUT, spec.SLOT_ELEM_TYPE, slot_dims)]
    new_nodes: dict[int, NodeProto] = {}
    pools: dict[str, Site] = {}  # module path -> its first site: a module applied twice shares one pool
    for site in sites:
        fields = spec.LoraFields(max_rank, slots, site.in_features, site.out_features,
                                 spec.DEFAULT_TILE if tile is None else tile)
        a, b, sc = (spec.input_name(k, site.path) for k in ("lora_a", "lora_b", "lora_scales"))
        first = pools.setdefault(site.path, site)
        if first is not site:
            _check_same_module(first, site)
        else:
            for name in (a, b, sc):
                if name in taken:
                    raise InputError(f"the model already has an input or initializer named {name!r}; inject once")
                taken.add(name)
            new_inputs += [make_input(a, site.elem_type, (slots, site.in_features, max_rank)),
                           make_input(b, site.elem_type, (slots, max_rank, site.out_features)),
                           make_input(sc, spec.SCALE_ELEM_TYPE, (slots,))]
        base = f"{site.y}.lora_base"
        g.node[site.node_index].output[0] = base
        attrs: dict[str, Any] = dict(fields.as_dict())  # onnx's make_node types **kwargs loosely
        if tile is None:
            del attrs["tile"]
        suffix = "" if first is site else f"_{site.node_index}"  # node names stay unique
        new_nodes[site.node_index] = onnx.helper.make_node(
            spec.PLUGIN_NAME, [site.x, base, a, b, spec.SLOT_IDS_INPUT, sc], [site.y],
            name=f"{site.path}/{spec.PLUGIN_NAME}{suffix}", domain=spec.ONNX_DOMAIN, **attrs)
    nodes = []
    for i, node in enumerate(g.node):
        nodes.append(node)
        if i in new_nodes:
            nodes.append(new_nodes[i])
    del g.node[:]
    g.node.extend(nodes)
    g.input.extend(new_inputs)
    if not any(imp.domain == spec.ONNX_DOMAIN for imp in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(spec.ONNX_DOMAIN, 1))
    return out


def set_missing_tiles(model: ModelProto, tile: int) -> int:
    """Give every LoRA plugin node without a ``tile`` attribute (in any graph) ``tile``, a GPU profile's ``[lora]``
    tile (what the plugin's AUTO tactic runs); a node that ``lora inject --tile`` pinned keeps its own. Returns how
    many nodes got it. Safety: the tile is a kernel blocking choice, never a numerics one."""
    spec.LoraFields(1, 1, 1, 1, tile)  # refuses a tile the kernel has not
    count = 0
    for g in all_graphs(model.graph):
        for node in g.node:
            if node.op_type == spec.PLUGIN_NAME and not any(a.name == "tile" for a in node.attribute):
                node.attribute.append(onnx.helper.make_attribute("tile", tile))
                count += 1
    return count
