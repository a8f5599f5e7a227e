"""Real TensorRT-RTX builds with LoRAOpPluginDynamic nodes (CPU-only AOT builds for SM 8.0 and 8.6)."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest

from trtforge.plugins import configure_builder, register_all
from trtforge.plugins.lora import spec
from trtforge.plugins.lora.inject import inject
from trtforge.plugins.lora.variants import AUTO, EXTRA_FIELDS, TRITON_BASE, valid_tactics
from trtforge_testing import parse_plugin_layers


@pytest.fixture(scope="module")
def rtx():
    pytest.importorskip("tensorrt_rtx")
    from trtforge.build_engine.engine.backend import prepare_plugin_loading, select_backend

    backend = select_backend("tensorrt-rtx")
    prepare_plugin_loading(backend)
    assert register_all(backend.module) == register_all(backend.module) == ["trtforge::LoRAOpPluginDynamic/1"]
    return backend.module


@pytest.fixture(scope="module")
def lora_network(rtx, tmp_path_factory):
    from trtforge.examples.llama import make_llama

    path = tmp_path_factory.mktemp("lora") / "lora.onnx"
    onnx.save(inject(make_llama(), ["q_proj", "v_proj"], max_rank=16, slots=8, tile=64), path)
    return parse_plugin_layers(rtx, path)


def test_parsed_plugin_layers_carry_the_onnx_fields(rtx, lora_network):
    _, _, layers = lora_network
    assert len(layers) == 4  # 2 layers x (q_proj, v_proj)
    by_name = {layer.name: layer for layer in layers}
    q = by_name[f"model.layers.0.self_attn.q_proj/{spec.PLUGIN_NAME}"].plugin
    v = by_name[f"model.layers.1.self_attn.v_proj/{spec.PLUGIN_NAME}"].plugin
    assert q.fields == spec.LoraFields(16, 8, 256, 256, 64)
    assert v.fields == spec.LoraFields(16, 8, 256, 64, 64)  # 2 kv heads x head_dim 32
    for layer, o in ((by_name[f"model.layers.0.self_attn.q_proj/{spec.PLUGIN_NAME}"], 256),
                     (by_name[f"model.layers.1.self_attn.v_proj/{spec.PLUGIN_NAME}"], 64)):
        out = layer.get_output(0)
        assert tuple(out.shape) == (-1, -1, o) and out.dtype == rtx.float32
        assert layer.get_input(spec.SLOT_IDS).dtype == rtx.int32


def test_fields_survive_serialization_round_trip(rtx, lora_network):
    _, _, layers = lora_network
    plugin = layers[0].plugin
    plugin.set_tactic(256)  # the builder's tactic choice replaces the tile field
    fc = plugin.get_fields_to_serialize()
    assert {f.name for f in fc} == set(spec.FIELD_NAMES) | set(EXTRA_FIELDS)
    creator = rtx.get_plugin_registry().get_creator(spec.PLUGIN_NAME, spec.PLUGIN_VERSION, spec.PLUGIN_NAMESPACE)
    again = creator.create_plugin(spec.PLUGIN_NAME, fc, rtx.TensorRTPhase.RUNTIME)
    assert again.fields == spec.LoraFields(16, 8, 256, 256, 256) and again.variant == 256
    assert again.get_valid_tactics() == valid_tactics()
    plugin.set_tactic(TRITON_BASE + 1)  # a Triton variant keeps the tile field
    again = creator.create_plugin(spec.PLUGIN_NAME, plugin.get_fields_to_serialize(), rtx.TensorRTPhase.RUNTIME)
    assert (again.variant, again.fields.tile) == (TRITON_BASE + 1, 256)
    assert again.get_aliased_input(0) == -1  # aliasing is opt-in (needs a builder preview feature)


def test_aliased_output_builds_with_preview_feature(rtx, lora_network, monkeypatch):
    from trtforge.build_engine.engine.backend import rtx_compute_capability_enum
    from trtforge.plugins.lora.trt_plugin import ALIAS_ENV

    monkeypatch.setenv(ALIAS_ENV, "1")
    builder, network, layers = lora_network
    assert layers[0].plugin.get_aliased_input(0) == spec.Y and layers[0].plugin.get_aliased_input(1) == -1
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(rtx_compute_capability_enum(rtx, "8.6"), 0)
    profile = builder.create_optimization_profile()
    for name in ("input_ids", spec.SLOT_IDS_INPUT):
        profile.set_shape(name, (1, 1), (2, 16), (4, 64))
    config.add_optimization_profile(profile)
    assert builder.build_serialized_network(network, config) is None  # refused without the preview feature
    configure_builder(rtx, config)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None and plan.nbytes > 100_000


@pytest.mark.parametrize("cc", ["8.0", "8.6"])
def test_engine_builds_with_plugin(rtx, lora_network, cc):
    from trtforge.build_engine.engine.backend import rtx_compute_capability_enum

    builder, network, _ = lora_network
    config = builder.create_builder_config()  # plain config: the default (non-aliased) plugin needs nothing more
    config.num_compute_capabilities = 1
    config.set_compute_capability(rtx_compute_capability_enum(rtx, cc), 0)
    profile = builder.create_optimization_profile()
    for name in ("input_ids", spec.SLOT_IDS_INPUT):
        profile.set_shape(name, (1, 1), (2, 16), (4, 64))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None and plan.nbytes > 100_000
    data = bytes(plan)
    # the plan records the plugin by name/namespace and its serialized fields
    assert spec.PLUGIN_NAME.encode() in data and spec.PLUGIN_NAMESPACE.encode() in data
    assert b"max_rank" in data and b"out_features" in data


def test_trt_plugin_module_imports_no_tensorrt():
    code = ("import sys, trtforge.plugins, trtforge.plugins.lora.trt_plugin, trtforge.plugins.lora.launch, "
            "trtforge.plugins.lora.aot_plugin; "
            "bad = [m for m in ('tensorrt', 'tensorrt_rtx', 'cuda', 'cuda.bindings', 'torch') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_supports_format_combination_rules(rtx):
    from trtforge.plugins.lora.trt_plugin import make_plugin_classes

    plugin_cls, _ = make_plugin_classes(rtx)
    plugin = plugin_cls(spec.LoraFields(8, 4, 32, 16))

    def desc(dtype, fmt=rtx.TensorFormat.LINEAR):
        d = rtx.DynamicPluginTensorDesc()
        d.desc.type, d.desc.format = dtype, fmt
        return d

    def ok(types):
        io = [desc(t) for t in types]
        return all(plugin.supports_format_combination(i, io, 6) for i in range(len(io)))

    for f in (rtx.float16, rtx.bfloat16, rtx.float32):
        assert ok([f, f, f, f, rtx.int32, rtx.float32, f])
        assert not ok([f, f, f, f, rtx.int64, rtx.float32, f])
        assert not ok([f, f, f, f, rtx.int32, f if f != rtx.float32 else rtx.float16, f])
    assert not ok([rtx.float16, rtx.float32, rtx.float16, rtx.float16, rtx.int32, rtx.float32, rtx.float16])
    assert not ok([rtx.int32] * 7)
    io = [desc(rtx.float16, rtx.TensorFormat.CHW2)] + [desc(rtx.float16)] * 6
    assert not plugin.supports_format_combination(0, io, 6)
    assert plugin.get_valid_tactics() == [AUTO, *spec.TILE_CHOICES, *(TRITON_BASE + i for i in range(4))]
