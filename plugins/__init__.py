"""trtforge's TensorRT plugins, one folder each (``lora/``), and the two calls the builder needs.

Nothing here imports TensorRT at import time: ``register_all`` takes the module (``tensorrt`` or ``tensorrt_rtx``)
the caller already chose.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


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


def has_plugin_nodes(model: Any) -> bool:
    """True when an ``onnx.ModelProto`` holds a node of any trtforge plugin (main graph or subgraphs)."""
    from trtforge.build_engine.passes.ir import all_graphs

    from .lora import spec

    names = {spec.PLUGIN_NAME}
    return any(node.op_type in names and node.domain in (spec.ONNX_DOMAIN, "")
               for graph in all_graphs(model.graph) for node in graph.node)
