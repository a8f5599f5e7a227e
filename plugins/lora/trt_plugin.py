"""``LoRAOpPluginDynamic`` as a Python ``IPluginV3`` plugin and its ``IPluginCreatorV3One`` creator.

TensorRT is never imported here: ``make_plugin_classes(trt_module)`` builds the two classes for whichever module the
caller passes (``tensorrt`` or ``tensorrt_rtx``; their Python plugin APIs are the same), and ``register(trt_module)``
registers one creator instance with that module's plugin registry (idempotent).

Build time (no GPU needed; covered by the TensorRT-RTX engine-build tests): output dtype = y's, output shape =
x.shape[:-1] + [out_features] through the expression builder (2-D and 3-D x), formats = linear only with all float
tensors in one dtype among fp16/bf16/fp32, slot_ids int32 and scales fp32, tactics = ``variants.valid_tactics()``
(AUTO, the fused kernel's tiles, the Triton configs), ``configure_plugin`` records the profile's maximum token
count; fields serialized as int32 plugin fields plus ``variant`` and ``max_tokens``.

Output aliasing: with ``TRTFORGE_LORA_ALIAS=1`` in the environment (read when TensorRT asks, i.e. at build time)
and a module that has ``IPluginV3OneBuildV2``, output 0 aliases input ``y``. TensorRT and TensorRT-RTX then refuse
to build unless the builder config enables the preview feature ``ALIASED_PLUGIN_IO_10_03``
(``trtforge.plugins.configure_builder`` does), which tools such as Polygraphy or trtexec do not do by default; so
aliasing is opt-in. By default both kernels write ``out = y + delta`` themselves (the fused one's COPY blocks copy
the rows without an adapter), so there is no y -> out copy. Run time (needs a GPU; tests/gpu exercises
``small_launch.run_variant``, the exact call ``enqueue`` makes, without TensorRT): ``attach_to_context`` loads the
kernel module (shared per CUDA context) and reserves the fused kernel's scratch for the profile's maximum, outside
any capture, plus the metadata buffer of the once-per-forward sort (forward_meta.py); ``enqueue`` launches on
TensorRT's stream. One scratch per plugin clone (layer and execution context): TensorRT may run parallel LoRA
layers on auxiliary streams, and two fused launches that overlap must not share the ticket words.
"""

from __future__ import annotations

import contextlib
import math
from types import ModuleType
from typing import Any

from trtforge.build_engine.core import env

from . import spec
from .forward_meta import REGISTRY
from .variants import AUTO, EXTRA_FIELDS, profile_max_tokens, reserved_scratch_bytes, valid_tactics

ALIAS_ENV = env.LORA_ALIAS.name
_CLASSES: dict[str, tuple[type, type]] = {}
_CREATORS: dict[str, Any] = {}  # keep creator objects alive: the registry holds only a raw pointer


def alias_enabled() -> bool:
    return env.get_flag(env.LORA_ALIAS)


def plugin_id() -> str:
    return f"{spec.PLUGIN_NAMESPACE}::{spec.PLUGIN_NAME}/{spec.PLUGIN_VERSION}"


def _dtype_name(trt: ModuleType, dt: Any) -> str | None:
    return {trt.DataType.HALF: "float16", trt.DataType.BF16: "bfloat16", trt.DataType.FLOAT: "float32"}.get(dt)


def fields_to_collection(trt: ModuleType, fields: spec.LoraFields, variant: int | None = None,
                         max_tokens: int | None = None) -> Any:
    """The op's fields, plus the chosen tactic and the profile's maximum token count when given."""
    import numpy as np

    values = {**fields.as_dict(), **({} if variant is None else {"variant": variant, "max_tokens": max_tokens or 0})}
    return trt.PluginFieldCollection([
        trt.PluginField(name, np.array([value], dtype=np.int32), trt.PluginFieldType.INT32)
        for name, value in values.items()
    ])


def fields_from_collection(fc: Any) -> tuple[spec.LoraFields, int, int]:
    """(fields, variant, max_tokens); a collection without the extras (an ONNX node) gives AUTO and 0."""
    values = {f.name: f.data for f in fc}
    extra = {name: int(values.pop(name)[0]) for name in EXTRA_FIELDS if name in values}
    return spec.LoraFields.from_mapping(values), extra.get("variant", AUTO), extra.get("max_tokens", 0)


def make_plugin_classes(trt: ModuleType) -> tuple[type, type]:
    """(LoraPlugin, LoraPluginCreator) for ``trt``; built once per module."""
    if trt.__name__ in _CLASSES:
        return _CLASSES[trt.__name__]
    build_base = getattr(trt, "IPluginV3OneBuildV2", None) or trt.IPluginV3OneBuild
    aliasing = build_base is not trt.IPluginV3OneBuild

    class LoraPlugin(trt.IPluginV3, trt.IPluginV3OneCore, build_base, trt.IPluginV3OneRuntime):  # type: ignore
        """One plugin instance per network layer (clones per execution context at runtime)."""

        def __init__(self, fields: spec.LoraFields, variant: int = AUTO, max_tokens: int = 0) -> None:
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            build_base.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.plugin_name = spec.PLUGIN_NAME
            self.plugin_namespace = spec.PLUGIN_NAMESPACE
            self.plugin_version = spec.PLUGIN_VERSION
            self.num_outputs = 1
            self.fields = fields
            self.variant = variant  # the tactic (variants.py)
            self.max_tokens = max_tokens  # the profile's maximum tokens (configure_plugin), sizes the scratch
            self.num_tokens = 0
            self.tokens_per_slot = 1
            self._launcher: Any = None
            self._context: int | None = None  # execution-context token (forward_meta.py), set at attach

        # --- core ---------------------------------------------------------------------------------------
        def get_capability_interface(self, capability_type: Any) -> Any:
            return self

        def clone(self) -> Any:
            other = LoraPlugin(self.fields, self.variant, self.max_tokens)
            other.num_tokens, other.tokens_per_slot = self.num_tokens, self.tokens_per_slot
            return other

        def destroy(self) -> None:
            launcher, self._launcher = self._launcher, None
            REGISTRY.forget(id(self))  # before the buffer goes: no later forward may read it
            if launcher is not None:
                # teardown (e.g. the CUDA context is already gone): nothing more to do
                with contextlib.suppress(Exception):
                    launcher.close()

        # --- build --------------------------------------------------------------------------------------
        if aliasing:
            def get_aliased_input(self, output_index: int) -> int:
                return spec.ALIASED_INPUT if output_index == 0 and alias_enabled() else -1

        def get_output_data_types(self, input_types: list[Any]) -> list[Any]:
            return [input_types[spec.Y]]

        def get_output_shapes(self, inputs: list[Any], shape_inputs: list[Any], expr_builder: Any) -> list[Any]:
            x = inputs[spec.X]
            if len(x) not in (2, 3):
                raise ValueError(f"{spec.PLUGIN_NAME}: x must be 2-D or 3-D, got rank {len(x)}")
            out = trt.DimsExprs(x)
            out[len(x) - 1] = expr_builder.constant(self.fields.out_features)
            return [out]

        def supports_format_combination(self, pos: int, in_out: list[Any], num_inputs: int) -> bool:
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            if pos == spec.SLOT_IDS:
                return desc.type == trt.DataType.INT32
            if pos == spec.SCALES:
                return desc.type == trt.DataType.FLOAT
            if pos == spec.X:
                return _dtype_name(trt, desc.type) is not None
            return desc.type == in_out[spec.X].desc.type  # y, lora_a, lora_b and the output share x's dtype

        def configure_plugin(self, inputs: list[Any], outputs: list[Any]) -> None:
            # build time: the profile's maximum, serialized so the runtime can reserve the scratch up front
            self.max_tokens = max(self.max_tokens, profile_max_tokens(tuple(inputs[spec.X].max)))

        def get_workspace_size(self, inputs: list[Any], outputs: list[Any]) -> int:
            return 0  # the kernel's scratch must persist across enqueues: the launcher owns it

        def get_valid_tactics(self) -> list[int]:
            return valid_tactics()

        # --- runtime ------------------------------------------------------------------------------------
        def set_tactic(self, tactic: int) -> None:
            if int(tactic) in valid_tactics():
                self.variant = int(tactic)
            if tactic in spec.TILE_CHOICES:
                self.fields = spec.LoraFields(**{**self.fields.as_dict(), "tile": int(tactic)})

        def get_fields_to_serialize(self) -> Any:
            return fields_to_collection(trt, self.fields, self.variant, self.max_tokens)

        def on_shape_change(self, inputs: list[Any], outputs: list[Any]) -> None:
            x = tuple(inputs[spec.X].dims)
            slots = tuple(inputs[spec.SLOT_IDS].dims)
            self.num_tokens = math.prod(x[:-1])
            self.tokens_per_slot = spec.tokens_per_slot(x, slots)

        def attach_to_context(self, context: Any) -> Any:
            """Per execution context: load the (shared) module and reserve the scratch now, outside any capture."""
            other = self.clone()
            if self.max_tokens > 0:
                from .launch import LoraLauncher, meta_bytes

                other._launcher = LoraLauncher()
                other._launcher.reserve_scratch(
                    reserved_scratch_bytes(self.fields, self.max_tokens, other._launcher.sm_count))
                other._launcher.reserve_meta(meta_bytes(self.max_tokens, self.fields.num_slots))
                other._context = id(context)
            return other

        def enqueue(self, input_desc: list[Any], output_desc: list[Any], inputs: list[int], outputs: list[int],
                    workspace: int, stream: int) -> None:
            from .launch import LoraLauncher
            from .small_launch import run_variant

            dtype = _dtype_name(trt, input_desc[spec.X].type)
            if dtype is None:
                raise ValueError(f"{spec.PLUGIN_NAME}: unsupported dtype {input_desc[spec.X].type}")
            if self._launcher is None:
                self._launcher = LoraLauncher()
            # Triton kernel: out = y + delta in one launch; fused kernel: in place when aliased, else copy then update
            run_variant(
                self._launcher, int(stream), self.fields, dtype, self.variant, x=int(inputs[spec.X]),
                y=int(inputs[spec.Y]), out=int(outputs[0]),
                lora_a=int(inputs[spec.LORA_A]), lora_b=int(inputs[spec.LORA_B]),
                slot_ids=int(inputs[spec.SLOT_IDS]), scales=int(inputs[spec.SCALES]),
                num_tokens=self.num_tokens, tokens_per_slot=self.tokens_per_slot, context=self._context,
                owner=id(self))

    class LoraPluginCreator(trt.IPluginCreatorV3One):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.IPluginCreatorV3One.__init__(self)
            self.name = spec.PLUGIN_NAME
            self.plugin_namespace = spec.PLUGIN_NAMESPACE
            self.plugin_version = spec.PLUGIN_VERSION
            self.field_names = fields_to_collection(trt, spec.LoraFields(1, 1, 1, 1))

        def create_plugin(self, name: str, fc: Any, phase: Any) -> Any:
            return LoraPlugin(*fields_from_collection(fc))

    _CLASSES[trt.__name__] = (LoraPlugin, LoraPluginCreator)
    return LoraPlugin, LoraPluginCreator


def register(trt: ModuleType) -> str:
    """Register the creator with ``trt``'s plugin registry (once per module); returns ``namespace::name/version``."""
    if trt.__name__ not in _CREATORS:
        registry = trt.get_plugin_registry()
        existing = registry.get_creator(spec.PLUGIN_NAME, spec.PLUGIN_VERSION, spec.PLUGIN_NAMESPACE)
        if existing is None:
            _, creator_cls = make_plugin_classes(trt)
            creator = creator_cls()
            if not registry.register_creator(creator, spec.PLUGIN_NAMESPACE):
                raise RuntimeError(f"{trt.__name__} refused to register {plugin_id()}")
            _CREATORS[trt.__name__] = creator
        else:
            _CREATORS[trt.__name__] = existing
    return plugin_id()
