"""What precision conversion needs to know about trtforge plugin nodes (``LoRAOpPluginDynamic``,
whose contract is ``spec.py``).

The LoRA op has no ONNX schema, so without help shape inference stops at it (every value downstream of a plugin
node has no type) and the policy would keep it fp32, Cast its x/y back up and leave q/v projections' consumers
mixing fp32 and fp16 (TensorRT then fails on a MatMul type mismatch far from the cause). The contract instead:

- x, y, lora_a, lora_b share one float dtype D; slot_ids are int32, scales float32; the output has y's dtype and
  shape. The plugin's fields (max_rank, num_slots, in_features, out_features, tile) hold no dtype, so converting
  never edits them: D is read from the tensors, by TensorRT as by ``decompose``.
- A plugin node whose D is float32 becomes a low-precision op of the target type: x and y come from the converted
  projection (or get a Cast), and the adapter-pool *graph inputs* ``lora_a.*`` / ``lora_b.*`` get their declared
  elem_type changed to the target type. They are adapter data in the engine's precision (``trtforge lora pack``
  writes them in it), unlike the user's I/O, which conversion keeps as declared. ``lora_scales.*`` stay float32
  and ``lora_slot_ids`` int32. Pools that are initializers or computed values are converted like any other float
  input of a low op (converted copy or Cast).
- A plugin node whose D is already 16-bit is left in D (the builder builds such models as they are; a 16-bit ->
  16-bit conversion would round twice). ``dtype_conflicts`` lists those whose D differs from a requested type, so
  the ``precision`` command can refuse them instead of writing a "bf16" model with float16 adapter pools.

For type inference (``stand_in``) a plugin node is replaced by ``Identity(y)``, which carries y's dtype and shape to
the output exactly as the op does; ``check_types`` then checks the op's own constraints, which Identity does not.
"""

from __future__ import annotations

from collections.abc import Mapping

from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper

from trtforge.build_engine.core.errors import ModelError

from . import spec

_DTYPE_NAMES: dict[int, str] = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
                               TensorProto.BFLOAT16: "bfloat16"}
_SHARED = (spec.X, spec.Y, spec.LORA_A, spec.LORA_B)  # inputs bound to the op's one float dtype D


def dtype_name(elem_type: int | None) -> str:
    return _DTYPE_NAMES.get(elem_type or 0, f"elem_type {elem_type}")


def _where(node: NodeProto) -> str:
    return f"{spec.PLUGIN_NAME} node {node.name or node.output[0]!r}"


def plugin_dtype(node: NodeProto, types: Mapping[str, int]) -> int | None:
    """The op's float dtype D as the graph declares it: lora_a's type (a graph input), else y's; None if unknown."""
    for i in (spec.LORA_A, spec.Y, spec.X):
        if len(node.input) > i and types.get(node.input[i]):
            return types[node.input[i]]
    return None


def stand_in(graph: GraphProto) -> None:
    """Replace (in place, on a throw-away copy) every plugin node with ``Identity(y) -> out`` for type inference."""
    for k, node in enumerate(graph.node):
        if spec.is_lora_node(node) and len(node.input) > spec.Y and node.output:
            graph.node[k].CopyFrom(helper.make_node("Identity", [node.input[spec.Y]], [node.output[0]],
                                                    name=node.name or node.output[0]))


def pools_to_retype(model: ModelProto, low_plugins: list[NodeProto], types: Mapping[str, int]) -> set[str]:
    """lora_a / lora_b graph inputs (not initializers) of plugin nodes converted to low, that are declared float32."""
    inits = {t.name for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input} - inits
    return {n.input[i] for n in low_plugins for i in (spec.LORA_A, spec.LORA_B)
            if n.input[i] in inputs and types.get(n.input[i]) == TensorProto.FLOAT}


def check_types(model: ModelProto, types: Mapping[str, int]) -> None:
    """The op's dtype constraints on a converted model (``types`` from inference); ModelError names the node.

    A failure here is a bug in the conversion, so it is reported before TensorRT meets the graph.
    """
    for node in model.graph.node:
        if not spec.is_lora_node(node) or len(node.input) != len(spec.INPUT_NAMES):
            continue
        got = {spec.INPUT_NAMES[i]: types.get(node.input[i]) for i in range(len(spec.INPUT_NAMES))}
        shared = {got[spec.INPUT_NAMES[i]] for i in _SHARED}
        bad = (len(shared) != 1 or not shared <= set(_DTYPE_NAMES)
               or got["slot_ids"] != spec.SLOT_ELEM_TYPE or got["scales"] != spec.SCALE_ELEM_TYPE)
        if bad:
            detail = ", ".join(f"{k} {dtype_name(v)}" for k, v in got.items())
            raise ModelError(f"precision conversion left {_where(node)} with inconsistent dtypes ({detail}); "
                             "x, y, lora_a, lora_b must share one float type, slot_ids int32, scales float32")


def dtype_conflicts(model: ModelProto, low: int) -> list[str]:
    """Plugin nodes already in a 16-bit type other than ``low`` (their graph-declared lora_a/y type), as text."""
    types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.value_info]}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    out = []
    for node in model.graph.node:
        if spec.is_lora_node(node):
            d = plugin_dtype(node, types)
            if d is not None and d not in (TensorProto.FLOAT, low):
                out.append(f"{_where(node)} is {dtype_name(d)}")
    return out
