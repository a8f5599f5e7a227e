"""trtforge's TensorRT plugins, one folder each (``lora/``): the registry of their ONNX ops, the one predicate that
recognises a plugin node, and the two calls the builder needs.

Nothing here imports TensorRT at import time: ``register_all`` takes the module (``tensorrt`` or ``tensorrt_rtx``)
the caller already chose.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from onnx import ModelProto, NodeProto

from trtforge.build_engine.core.graph import model_nodes

from .lora import spec as _lora_spec

#: The registry: each plugin's ONNX op name -> its spec's node predicate. Plugin folders never import this package
#: (their modules ask their own spec), so the registry depends on the plugins and not the other way round.
PLUGIN_OPS: dict[str, Callable[[NodeProto], bool]] = {_lora_spec.PLUGIN_NAME: _lora_spec.is_lora_node}


def register_all(trt_module: ModuleType) -> list[str]:
    """Register every trtforge plugin creator with ``trt_module``'s plugin registry; idempotent.

    Returns ``namespace::name/version`` of each creator registered (or already registered) in that module.
    """
    from .lora.trt_plugin import register

    return [register(trt_module)]


def configure_builder(trt_module: ModuleType, config: Any) -> None:
    """Enable on a builder config what trtforge plugins may need: aliased plugin I/O.

    The LoRA plugin aliases its output to ``y`` only when ``TRTFORGE_LORA_ALIAS=1`` (opt-in); TensorRT (10.3+) and
    TensorRT-RTX then refuse to build unless the preview feature ``ALIASED_PLUGIN_IO_10_03`` is on. Enabling it is
    harmless otherwise, so builders call this for every config of a network that holds plugin nodes.
    """
    feature = getattr(getattr(trt_module, "PreviewFeature", None), "ALIASED_PLUGIN_IO_10_03", None)
    if feature is not None:
        config.set_preview_feature(feature, True)


def is_plugin_node(node: NodeProto) -> bool:
    """The one "is this a trtforge plugin node" predicate: an op of a registered plugin (``PLUGIN_OPS``), as that
    plugin's spec recognises it."""
    match = PLUGIN_OPS.get(node.op_type)
    return match is not None and match(node)


def has_plugin_nodes(model: ModelProto) -> bool:
    """True when a model holds a trtforge plugin node anywhere: main graph, If/Loop/Scan bodies, local functions."""
    return any(is_plugin_node(node) for node in model_nodes(model))
