"""Precision conversion of LoRA-injected models (``LoRAOpPluginDynamic`` nodes): onnxruntime runs of the decomposed
models against fp32, and real TensorRT-RTX builds whose profile converts the precision."""

from __future__ import annotations

import importlib.util
import json
import secrets
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtforge.build_engine.precision.convert import convert_precision
from trtforge.examples.llama import LlamaConfig, make_llama
from trtforge.plugins.lora.decompose import decompose
from trtforge.plugins.lora.inject import inject
from trtforge.plugins.lora.spec import PLUGIN_NAME, SLOT_IDS_INPUT
from trtforge_testing import assert_one_line_error

T = onnx.TensorProto
TARGETS = ["q_proj", "v_proj"]
RANK, SLOTS = 8, 4
# Max abs error over max abs fp32 logits. fp16 with the adapters on measures ~6e-4..1e-3 here (plain: ~1e-3).
TOL_FP16 = 2e-2
TOL_BF16 = 3e-2  # measured ~8e-3 (plain model: ~1e-2)
HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None


@pytest.fixture(scope="module")
def lora32() -> onnx.ModelProto:
    return inject(make_llama(), TARGETS, max_rank=RANK, slots=SLOTS)


@pytest.fixture(scope="module")
def lora16(lora32: onnx.ModelProto) -> onnx.ModelProto:
    return convert_precision(lora32, "fp16").model


def _session(model: onnx.ModelProto):  # noqa: ANN202 - onnxruntime is a heavy import
    import onnxruntime as ort

    opts = ort.SessionOptions()
    # No graph rewrites and no prepacked GEMMs: the same op on the same inputs then gives the same bits.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _feeds(model: onnx.ModelProto, rng: np.random.Generator, shape: tuple[int, int],
           pool_type: type = np.float16) -> dict[str, np.ndarray]:
    """Random ids, pools (values representable in ``pool_type``, so both precisions see the same adapters), slots."""
    feeds: dict[str, np.ndarray] = {"input_ids": rng.integers(1, LlamaConfig().vocab, size=shape, dtype=np.int64)}
    for vi in model.graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name.startswith(("lora_a.", "lora_b.")):
            feeds[vi.name] = (rng.standard_normal(dims) * 0.1).astype(pool_type).astype(np.float32)
        elif vi.name.startswith("lora_scales."):
            feeds[vi.name] = rng.uniform(0.5, 2.0, size=dims).astype(np.float32)
    slots = rng.integers(-1, SLOTS, size=shape, dtype=np.int32)
    slots.flat[0], slots.flat[-1] = -1, SLOTS - 1  # both kinds of token, whatever the draw
    feeds[SLOT_IDS_INPUT] = slots
    return feeds


def _cast_pools(feeds: dict[str, np.ndarray], model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The feeds in each input's declared dtype (the converted model declares fp16 pools)."""
    np_type = {vi.name: onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
               for vi in model.graph.input}
    return {k: v.astype(np_type[k]) for k, v in feeds.items()}


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def test_pool_inputs_take_the_target_type(lora32: onnx.ModelProto, lora16: onnx.ModelProto) -> None:
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in lora16.graph.input}
    pools = [n for n in declared if n.startswith(("lora_a.", "lora_b."))]
    assert len(pools) == 2 * 2 * len(TARGETS)
    assert all(declared[n] == T.FLOAT16 for n in pools), declared
    assert all(declared[n] == T.FLOAT for n in declared if n.startswith("lora_scales."))
    assert declared[SLOT_IDS_INPUT] == T.INT32 and declared["input_ids"] == T.INT64
    assert [o.type.tensor_type.elem_type for o in lora16.graph.output] == [T.FLOAT]  # user I/O kept
    plugins = {n.name: n for n in lora16.graph.node if n.op_type == PLUGIN_NAME}
    before = {n.name: n for n in lora32.graph.node if n.op_type == PLUGIN_NAME}
    assert plugins.keys() == before.keys() and len(plugins) == 2 * len(TARGETS)
    assert all(plugins[k].attribute == before[k].attribute for k in plugins)  # fields hold no dtype: unchanged
    types = {v.name: v.type.tensor_type.elem_type for v in lora16.graph.value_info}
    types.update(declared)
    for node in plugins.values():  # x and y come from the converted projection, no Cast back to fp32
        assert [types.get(node.input[i]) for i in range(4)] == [T.FLOAT16] * 4, node.name
        assert types[node.output[0]] == T.FLOAT16


def test_decomposed_fp16_matches_fp32_and_slots_off_matches_plain(lora32: onnx.ModelProto,
                                                                   lora16: onnx.ModelProto) -> None:
    seed = secrets.randbits(32)
    rng = np.random.default_rng(seed)
    dec32, dec16 = decompose(lora32), decompose(lora16)
    feeds = _feeds(lora32, rng, (2, 9))
    ref = _session(dec32).run(None, feeds)[0]
    out = _session(dec16).run(None, _cast_pools(feeds, dec16))[0]
    off32 = _session(dec32).run(None, {**feeds, SLOT_IDS_INPUT: np.full((2, 9), -1, np.int32)})[0]
    rel, effect = _rel(out, ref), _rel(off32, ref)
    print(f"decomposed fp16 vs fp32 with adapters: {rel:.2e}; adapters' effect on fp32 logits {effect:.2e} "
          f"(seed {seed})")
    assert np.isfinite(out).all() and rel < TOL_FP16, (rel, seed)
    assert effect > 10 * rel, (effect, rel, seed)  # the adapters change the logits far beyond fp16's error
    # All slots -1: Where(slot >= 0, ..., y) returns y's bits, and every other node of the converted LoRA model is
    # the node the plain fp16 conversion makes (same ops, same order, same fp16 weights), so the logits are equal
    # bit for bit under onnxruntime without graph rewrites or prepacking.
    plain16 = convert_precision(make_llama(), "fp16").model
    off = {**_cast_pools(feeds, dec16), SLOT_IDS_INPUT: np.full((2, 9), -1, np.int32)}
    got = _session(dec16).run(None, off)[0]
    want = _session(plain16).run(None, {"input_ids": feeds["input_ids"]})[0]
    assert np.array_equal(got, want), (_rel(got, want), seed)


def test_decomposed_bf16_matches_fp32_onnx_reference(lora32: onnx.ModelProto) -> None:
    """onnxruntime's CPU provider has no bf16 MatMul, so the bf16 conversion runs in onnx.reference."""
    import ml_dtypes
    from onnx.reference import ReferenceEvaluator

    seed = secrets.randbits(32)
    lora_bf16 = convert_precision(lora32, "bf16").model
    assert {vi.type.tensor_type.elem_type for vi in lora_bf16.graph.input
            if vi.name.startswith(("lora_a.", "lora_b."))} == {T.BFLOAT16}
    feeds = _feeds(lora32, np.random.default_rng(seed), (2, 9), ml_dtypes.bfloat16)
    ref = ReferenceEvaluator(decompose(lora32)).run(None, feeds)[0]
    out = ReferenceEvaluator(decompose(lora_bf16)).run(None, _cast_pools(feeds, lora_bf16))[0]
    rel = _rel(out, ref)
    print(f"decomposed bf16 vs fp32 with adapters (onnx.reference): {rel:.2e} (seed {seed})")
    assert np.isfinite(out).all() and rel < TOL_BF16, (rel, seed)


def test_plugin_already_16bit_cli_refuses_other_type(cli, tmp_path: Path) -> None:
    """Inject after fp16 conversion, then --to bf16: refused (pools would stay float16); --to fp16 keeps them."""
    src = tmp_path / "lora16.onnx"
    onnx.save(inject(convert_precision(make_llama(), "fp16").model, TARGETS, max_rank=RANK, slots=SLOTS), src)
    bad = cli("precision", src, "-o", tmp_path / "bf16.onnx", "--to", "bf16")
    assert_one_line_error(bad, 2, "lora16.onnx", "float16", "lora inject", "--to bf16")
    assert not (tmp_path / "bf16.onnx").exists()
    ok = cli("precision", src, "-o", tmp_path / "fp16.onnx", "--to", "fp16")
    assert ok.code == 0, ok.err
    same = onnx.load(tmp_path / "fp16.onnx")
    pools = {vi.name: vi.type.tensor_type.elem_type for vi in same.graph.input if vi.name.startswith("lora_")}
    assert pools and all(t == (T.FLOAT if n.startswith("lora_scales.") else T.FLOAT16) for n, t in pools.items()
                         if n != SLOT_IDS_INPUT)
    # The library (what the builder calls for a bf16 profile) leaves a float16 plugin in float16, consistently.
    kept = convert_precision(onnx.load(src), "bf16")
    assert kept.report.plugin_nodes_low == 0 and kept.report.pool_inputs_converted == 0


@pytest.mark.skipif(not HAS_RTX, reason="tensorrt_rtx not installed")
@pytest.mark.parametrize(("profile", "dtype"), [("a100", "bfloat16"), ("a10", "float16")])
def test_build_converts_fp32_lora_model(cli, lora32: onnx.ModelProto, tmp_path: Path, profile: str,
                                        dtype: str) -> None:
    """Real TensorRT-RTX build of the fp32 LoRA model: the profile's precision converts plugin nodes and pools."""
    from trtforge.plugins.lora.spec import PLUGIN_NAMESPACE, PLUGIN_VERSION

    src = tmp_path / "lora32.onnx"
    onnx.save(lora32, src)
    res = cli("build", src, "--profile", profile, "-o", tmp_path / "engine", "--no-progress")
    assert res.code == 0, res.err
    manifest = json.loads((tmp_path / "engine" / "manifest.json").read_text())
    assert manifest["precision"] == {"bfloat16": "bf16", "float16": "fp16"}[dtype]
    assert manifest["plugins"] == [{"name": PLUGIN_NAME, "namespace": PLUGIN_NAMESPACE, "version": PLUGIN_VERSION,
                                    "implementation": "python"}]
    by_name = {i["name"]: i["dtype"] for i in manifest["inputs"]}
    pools = [n for n in by_name if n.startswith(("lora_a.", "lora_b."))]
    assert len(pools) == 2 * 2 * len(TARGETS) and {by_name[n] for n in pools} == {dtype}
    assert {by_name[n] for n in by_name if n.startswith("lora_scales.")} == {"float32"}
    assert by_name[SLOT_IDS_INPUT] == "int32" and by_name["input_ids"] == "int64"
    assert [o["dtype"] for o in manifest["outputs"]] == ["float32"]
    assert (tmp_path / "engine" / "model.plan").stat().st_size > 100_000
