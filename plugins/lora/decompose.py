"""The decompose pass: lower every ``LoRAOpPluginDynamic`` node to standard ONNX ops (opset >= 13).

The result runs in onnxruntime, ``onnx.reference``, Polygraphy and any TensorRT without the plugin, so it is the
reference an engine with the plugin is diffed against. Per node, with ``ids`` the slot ids:

    c = Max(ids, 0)                                  # clamp -1 so Gather stays in range; masked out below
    per token:     v = MatMul(Unsqueeze(x, -2), Gather(A, c))   -> [..., 1, R]
                   u = Squeeze(MatMul(v, Gather(B, c)), -2)     -> [..., O]
    per sequence:  u = MatMul(MatMul(x, Gather(A, c)), Gather(B, c))   (x [B, S, H], ids [B])
    out = Where(ids >= 0, y + u * Cast(Gather(scales, c), D), y)

Where(..., y) returns y's own bits for slot -1, so a model with every slot at -1 computes exactly what the original
model computed. Per token vs per sequence comes from the ranks of x and slot_ids (shape inference; a node whose x
rank inference cannot see, because it lies downstream of another plugin node, takes the rank of a node sharing its
slot_ids input); a node whose layout stays unknown is refused. The gathered per-token pools are [tokens, H, R]
tensors: fine for a reference, not fast.

Only main-graph nodes are lowered (what ``lora inject`` writes); a plugin node inside an If/Loop/Scan body or a
model-local function is refused (InputError), never left behind in a model said to hold only standard ops.
"""

from __future__ import annotations

from onnx import ModelProto, NodeProto, TensorProto, helper

from trtforge.build_engine.core import steps
from trtforge.build_engine.core.errors import InputError
from trtforge.build_engine.core.graph import model_nodes
from trtforge.build_engine.core.onnx_skeleton import check_model

from . import spec
from ._graph import FLOAT_TYPES, default_opset, value_types


def _const(name: str, values: list[int]) -> NodeProto:
    return helper.make_node("Constant", [], [name], name=name,
                            value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values))


def _lower(node: NodeProto, x_rank: int, ids_rank: int, dtype: int) -> list[NodeProto]:
    x, y, a, b, ids, scales = node.input
    out = node.output[0]
    p = f"{out}/decomposed"  # the output name is unique (SSA); node names need not be
    if ids_rank == x_rank - 1 and x_rank in (2, 3):
        mode = "token"
    elif x_rank == 3 and ids_rank == 1:
        mode = "sequence"
    else:
        raise InputError(f"x has rank {x_rank} and slot_ids rank {ids_rank}; slot_ids must be x.shape[:-1] (per "
                         "token) or [batch] with a 3-D x (per sequence)")
    nodes = [
        _const(f"{p}/zero", [0]),
        helper.make_node("Cast", [f"{p}/zero"], [f"{p}/zero_i32"], to=spec.SLOT_ELEM_TYPE, name=f"{p}/zero_i32"),
        helper.make_node("Max", [ids, f"{p}/zero_i32"], [f"{p}/ids_c"], name=f"{p}/clamp"),
        helper.make_node("Gather", [a, f"{p}/ids_c"], [f"{p}/a"], axis=0, name=f"{p}/gather_a"),
        helper.make_node("Gather", [b, f"{p}/ids_c"], [f"{p}/b"], axis=0, name=f"{p}/gather_b"),
        helper.make_node("Gather", [scales, f"{p}/ids_c"], [f"{p}/s32"], axis=0, name=f"{p}/gather_s"),
        helper.make_node("Cast", [f"{p}/s32"], [f"{p}/s"], to=dtype, name=f"{p}/cast_s"),
        helper.make_node("GreaterOrEqual", [ids, f"{p}/zero_i32"], [f"{p}/on"], name=f"{p}/on"),
    ]
    if mode == "token":
        nodes += [
            _const(f"{p}/ax_m2", [-2]), _const(f"{p}/ax_m1", [-1]),
            helper.make_node("Unsqueeze", [x, f"{p}/ax_m2"], [f"{p}/xu"], name=f"{p}/xu"),
            helper.make_node("MatMul", [f"{p}/xu", f"{p}/a"], [f"{p}/v"], name=f"{p}/shrink"),
            helper.make_node("MatMul", [f"{p}/v", f"{p}/b"], [f"{p}/u3"], name=f"{p}/expand"),
            helper.make_node("Squeeze", [f"{p}/u3", f"{p}/ax_m2"], [f"{p}/u"], name=f"{p}/u"),
            helper.make_node("Unsqueeze", [f"{p}/s", f"{p}/ax_m1"], [f"{p}/sb"], name=f"{p}/sb"),
            helper.make_node("Unsqueeze", [f"{p}/on", f"{p}/ax_m1"], [f"{p}/mask"], name=f"{p}/mask"),
        ]
    else:
        nodes += [
            _const(f"{p}/ax_12", [1, 2]),
            helper.make_node("MatMul", [x, f"{p}/a"], [f"{p}/v"], name=f"{p}/shrink"),
            helper.make_node("MatMul", [f"{p}/v", f"{p}/b"], [f"{p}/u"], name=f"{p}/expand"),
            helper.make_node("Unsqueeze", [f"{p}/s", f"{p}/ax_12"], [f"{p}/sb"], name=f"{p}/sb"),
            helper.make_node("Unsqueeze", [f"{p}/on", f"{p}/ax_12"], [f"{p}/mask"], name=f"{p}/mask"),
        ]
    nodes += [
        helper.make_node("Mul", [f"{p}/u", f"{p}/sb"], [f"{p}/upd"], name=f"{p}/scale"),
        helper.make_node("Add", [y, f"{p}/upd"], [f"{p}/sum"], name=f"{p}/add"),
        helper.make_node("Where", [f"{p}/mask", f"{p}/sum", y], [out], name=f"{p}/where"),
    ]
    return nodes


@steps.timed("decompose")
def decompose(model: ModelProto, *, inplace: bool = False) -> ModelProto:
    """A new model with every plugin node of the main graph replaced by standard ops (input not mutated unless
    ``inplace``: then it is the model changed and returned, with no copy of its weights)."""
    main = sum(1 for n in model.graph.node if spec.is_lora_node(n))
    nested = sum(1 for n in model_nodes(model) if spec.is_lora_node(n)) - main
    if nested:
        raise InputError(f"{nested} {spec.PLUGIN_NAME} node(s) sit inside an If/Loop/Scan body or a model-local "
                         "function, which decompose does not lower (main graph only); inline the function or move "
                         "the LoRA nodes to the main graph (lora inject puts them there)")
    if not main:
        out = ModelProto()
        out.CopyFrom(model)
        return out
    if default_opset(model) < 13:
        raise InputError(f"decompose needs default-domain opset >= 13 (model has {default_opset(model)}); "
                         "convert the model with onnx.version_converter first")
    types = value_types(model)
    # Shape inference stops at plugin nodes, so a target downstream of another one (o_proj after q_proj) may have an
    # unknown x rank. Nodes sharing one slot_ids input share one layout (inject enforces it): learn it from any node
    # whose rank is known.
    known_rank: dict[str, int] = {}
    for node in model.graph.node:
        xt = types.get(node.input[0]) if spec.is_lora_node(node) and node.input else None
        if xt is not None and xt.shape is not None and len(node.input) > spec.SLOT_IDS:
            known_rank.setdefault(node.input[spec.SLOT_IDS], len(xt.shape))
    if inplace:
        out = model
    else:
        out = ModelProto()
        out.CopyFrom(model)
    nodes: list[NodeProto] = []
    for node in out.graph.node:
        if not spec.is_lora_node(node):
            nodes.append(node)
            continue
        where = f"plugin node {node.name or node.output[0]!r}"
        if len(node.input) != len(spec.INPUT_NAMES):
            raise InputError(f"{where} has {len(node.input)} inputs; expected {len(spec.INPUT_NAMES)} "
                             f"({', '.join(spec.INPUT_NAMES)})")
        spec.LoraFields.from_mapping({a.name: helper.get_attribute_value(a) for a in node.attribute})
        xt, it = types.get(node.input[0]), types.get(node.input[spec.SLOT_IDS])
        dt = types.get(node.input[spec.LORA_A]) or types.get(node.input[spec.Y])
        x_rank = len(xt.shape) if xt is not None and xt.shape is not None else known_rank.get(node.input[spec.SLOT_IDS])
        if x_rank is None or it is None or it.shape is None:
            raise InputError(f"{where}: the ranks of x and slot_ids are unknown; run shape inference first")
        if dt is None or dt.elem_type not in FLOAT_TYPES:
            raise InputError(f"{where}: cannot tell the float dtype of lora_a")
        try:
            nodes += _lower(node, x_rank, len(it.shape), dt.elem_type)
        except InputError as exc:
            raise InputError(f"{where}: {exc.message}") from exc
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    keep = [imp for imp in out.opset_import if imp.domain != spec.ONNX_DOMAIN]
    del out.opset_import[:]
    out.opset_import.extend(keep)
    check_model(out)  # on the weight-free skeleton: a model over 2 GiB cannot be serialised for onnx's checker
    return out
