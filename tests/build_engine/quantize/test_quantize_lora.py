"""LoRA and quantization compose in both orders; plugin nodes and their pools are never quantized."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from quant_testing import TINY, held_out

from trtforge.build_engine.core.onnx_io import MIGRATION_DOC
from trtforge.plugins.lora.decompose import decompose
from trtforge.plugins.lora.inject import inject

TARGETS = ["q_proj", "v_proj"]
SLOTS, RANK = 2, 4


def _feeds(model: onnx.ModelProto, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    feeds = []
    for base in held_out(count=2):
        f = dict(base)
        for vi in model.graph.input:
            if vi.name.startswith(("lora_a.", "lora_b.")):
                dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
                f[vi.name] = (rng.standard_normal(dims) * 0.05).astype(np.float32)
            elif vi.name.startswith("lora_scales."):
                f[vi.name] = np.full((SLOTS,), 2.0, np.float32)
        f["lora_slot_ids"] = rng.integers(-1, SLOTS, base["input_ids"].shape).astype(np.int32)
        feeds.append(f)
    return feeds


def _run(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(decompose(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return [sess.run(["logits"], f)[0] for f in feeds]


def _quantize(model: onnx.ModelProto, mode: str) -> onnx.ModelProto:
    """Calibrated on the same token ids with or without LoRA inputs (slot ids -1: the base model's activations)."""
    from trtforge.build_engine.quantize import CalibSet, QuantConfig, quantize

    samples = []
    for ids in held_out(seed=0, count=4, seq=16):
        sample = dict(ids)
        for vi in model.graph.input:
            if vi.name.startswith("lora_"):
                dims = [d.dim_value or ids["input_ids"].shape[k] for k, d in enumerate(vi.type.tensor_type.shape.dim)]
                dtype = np.int32 if vi.name == "lora_slot_ids" else np.float32
                sample[vi.name] = np.full(dims, -1 if dtype == np.int32 else 0, dtype)
        samples.append(sample)
    return quantize(model, QuantConfig(mode=mode), CalibSet(tuple(samples), "test samples")).model


def _plugins(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "LoRAOpPluginDynamic"]


def _rel(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a, b, strict=True)) / sum((x ** 2).sum() for x in a)))


@pytest.mark.parametrize("mode", ["int8", "int4-wo"])
def test_inject_then_quantize_and_quantize_then_inject(mode: str, tiny_path: Path) -> None:
    fp32 = onnx.load(tiny_path)
    lora = inject(fp32, TARGETS, max_rank=RANK, slots=SLOTS)
    feeds = _feeds(lora, 5)
    ref = _run(lora, feeds)

    a = _quantize(lora, mode)  # inject, then quantize
    before = {n.name: list(n.input) for n in _plugins(lora)}
    after = {n.name: list(n.input) for n in _plugins(a)}
    assert after == before  # plugin nodes untouched: x is still the float activation, pools still graph inputs
    pools = {vi.name: vi.type.tensor_type.elem_type for vi in lora.graph.input}
    assert {vi.name: vi.type.tensor_type.elem_type for vi in a.graph.input} == pools

    b = inject(_quantize(fp32, mode), TARGETS, max_rank=RANK, slots=SLOTS)  # quantize, then inject
    producer = {o: n for n in b.graph.node for o in n.output}
    for node in _plugins(b):
        x_src = producer[node.input[0]]
        assert x_src.op_type != "DequantizeLinear" and x_src.doc_string != MIGRATION_DOC, x_src.name  # float x
    # Same adapters, same inputs: both orders compute the same thing up to quantization error.
    got_a, got_b = _run(a, feeds), _run(b, feeds)
    limit = {"int8": 0.1, "int4-wo": 0.4}[mode]
    assert _rel(ref, got_a) < limit and _rel(ref, got_b) < limit
    assert _rel(got_a, got_b) < 1e-5  # the plugin sees the same float x either way


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="tensorrt_rtx not installed")
def test_quantized_lora_engine_builds(tiny_path: Path, tmp_path: Path) -> None:
    from trtforge.build_engine.engine.builder import build_engine

    model = inject(_quantize(onnx.load(tiny_path), "int8"), TARGETS, max_rank=RANK, slots=SLOTS)
    path = tmp_path / "q_lora.onnx"
    onnx.save(model, path)
    manifest = build_engine(path, "a100", tmp_path / "engine", progress=False)
    assert manifest.precision == "int8" and [p.name for p in manifest.plugins] == ["LoRAOpPluginDynamic"]
    assert TINY.layers == 1
