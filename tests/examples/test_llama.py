"""The example Llama: valid ONNX, numerically a Llama (vs an independent float64 NumPy forward), exporter fragments
present, deterministic, and written by make_example."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from trtforge.examples.llama import BIGGER, PROJECTIONS, LlamaConfig, hf_config, make_llama

CFG = LlamaConfig()


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    return {v: make_llama(CFG, v, seed=0) for v in ("fp32", "fp16-autocast")}


def _run(model: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    (out,) = sess.run(["logits"], {"input_ids": ids})
    return out


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}


def reference_forward(w: dict[str, np.ndarray], c: LlamaConfig, ids: np.ndarray) -> np.ndarray:
    """Independent float64 Llama forward (HF LlamaForCausalLM semantics, no cache); projections are [in, out]."""
    b, s = ids.shape
    d, nh, nkv = c.head_dim, c.heads, c.kv_heads

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return g * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.rms_norm_eps))

    inv = 1.0 / (c.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    ang = np.arange(s, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(t: np.ndarray) -> np.ndarray:
        rot = np.concatenate([-t[..., d // 2:], t[..., : d // 2]], -1)
        return t * cos + rot * sin

    causal = np.triu(np.ones((s, s), bool), k=1)
    h = w["model.embed_tokens.weight"][ids]
    for i in range(c.layers):
        p = f"model.layers.{i}"
        x = rms(h, w[f"{p}.input_layernorm.weight"])
        q = (x @ w[f"{p}.self_attn.q_proj.weight"]).reshape(b, s, nh, d).transpose(0, 2, 1, 3)
        k = (x @ w[f"{p}.self_attn.k_proj.weight"]).reshape(b, s, nkv, d).transpose(0, 2, 1, 3)
        v = (x @ w[f"{p}.self_attn.v_proj.weight"]).reshape(b, s, nkv, d).transpose(0, 2, 1, 3)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
        scores = np.where(causal, -np.inf, scores)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, nh * d)
        h = h + ctx @ w[f"{p}.self_attn.o_proj.weight"]
        x = rms(h, w[f"{p}.post_attention_layernorm.weight"])
        gate = x @ w[f"{p}.mlp.gate_proj.weight"]
        h = h + ((gate / (1 + np.exp(-gate))) * (x @ w[f"{p}.mlp.up_proj.weight"])) @ w[f"{p}.mlp.down_proj.weight"]
    return rms(h, w["model.norm.weight"]) @ w["lm_head.weight"]


def test_checker_and_interface(models: dict[str, onnx.ModelProto]) -> None:
    for variant, m in models.items():
        onnx.checker.check_model(m, full_check=True)
        assert m.opset_import[0].version in (17, 18)
        (inp,), (out,) = m.graph.input, m.graph.output
        assert inp.name == "input_ids" and inp.type.tensor_type.elem_type == TensorProto.INT64
        assert [d.dim_param for d in inp.type.tensor_type.shape.dim] == ["batch", "sequence"]
        assert out.name == "logits" and out.type.tensor_type.elem_type == TensorProto.FLOAT
        dims = out.type.tensor_type.shape.dim
        assert (dims[0].dim_param, dims[1].dim_param, dims[2].dim_value) == ("batch", "sequence", CFG.vocab)
        nodes = {n.name: n for n in m.graph.node}
        inits = {t.name: t for t in m.graph.initializer}
        want_dtype = TensorProto.FLOAT if variant == "fp32" else TensorProto.FLOAT16
        for i in range(CFG.layers):
            for scope, wname in PROJECTIONS:
                node = nodes[f"/model/layers.{i}/{scope}/MatMul"]
                weight = inits[f"model.layers.{i}.{wname}.weight"]
                assert node.op_type == "MatMul" and node.input[1] == weight.name
                assert weight.data_type == want_dtype
        q = inits["model.layers.0.self_attn.q_proj.weight"]
        k = inits["model.layers.0.self_attn.k_proj.weight"]
        assert list(q.dims) == [CFG.hidden, CFG.heads * CFG.head_dim]  # [in, out]
        assert list(k.dims) == [CFG.hidden, CFG.kv_heads * CFG.head_dim]  # grouped-query: fewer KV heads


def test_fp32_matches_float64_reference(models: dict[str, onnx.ModelProto], rng: np.random.Generator) -> None:
    for b, s in ((2, 7), (1, 13)):
        ids = rng.integers(0, CFG.vocab, size=(b, s), dtype=np.int64)
        got = _run(models["fp32"], ids)
        ref = reference_forward(_weights(models["fp32"]), CFG, ids)
        assert got.shape == (b, s, CFG.vocab) and got.dtype == np.float32
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_fp16_autocast_within_fp16_tolerance(models: dict[str, onnx.ModelProto], rng: np.random.Generator) -> None:
    ids = rng.integers(0, CFG.vocab, size=(2, 7), dtype=np.int64)
    got = _run(models["fp16-autocast"], ids)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    # Reference on the fp16-rounded weights: what remains is fp16 activation rounding.
    ref = reference_forward(_weights(models["fp16-autocast"]), CFG, ids)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < 5e-3, rel  # measured ~4e-4 with onnxruntime CPU
    # And the fp16 model is the fp32 model rounded: same seed, same weights up to fp16 rounding.
    w32, w16 = _weights(models["fp32"]), _weights(models["fp16-autocast"])
    np.testing.assert_allclose(w16["lm_head.weight"], w32["lm_head.weight"], rtol=1e-3, atol=1e-7)


def test_causal_prefix_consistency(models: dict[str, onnx.ModelProto], rng: np.random.Generator) -> None:
    """Causality: logits of a prefix do not change when tokens are appended."""
    ids = rng.integers(0, CFG.vocab, size=(2, 9), dtype=np.int64)
    full, prefix = _run(models["fp32"], ids), _run(models["fp32"], ids[:, :5])
    np.testing.assert_allclose(full[:, :5], prefix, rtol=1e-5, atol=1e-6)


def _consumers(m: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for n in m.graph.node:
        for x in n.input:
            out.setdefault(x, []).append(n)
    return out


def test_exporter_fragments_present(models: dict[str, onnx.ModelProto]) -> None:
    for variant, m in models.items():
        ops = Counter(n.op_type for n in m.graph.node)
        assert ops["Identity"] >= 1 and ops["Cast"] >= 5, (variant, ops)
        producers = {o: n for n in m.graph.node for o in n.output}
        inits = {t.name for t in m.graph.initializer}
        assert any(n.op_type == "Identity" and n.input[0] in inits for n in m.graph.node)
        casts = [n for n in m.graph.node if n.op_type == "Cast"]
        # Shape(Cast(x))
        assert any(n.op_type == "Shape" and producers[n.input[0]].op_type == "Cast" for n in m.graph.node)
        # Cast of a Constant
        assert any(n.input[0] in producers and producers[n.input[0]].op_type == "Constant" for n in casts)
        # Duplicate sibling Casts: two Casts of one tensor to the same type.
        sib = Counter((n.input[0], n.attribute[0].i) for n in casts)
        assert max(sib.values()) >= 2
        # Cast to the same type: input_ids (int64) cast to int64.
        assert any(n.input[0] == "input_ids" and n.attribute[0].i == TensorProto.INT64 for n in casts)
        # Boundaries around norms and softmax: a Cast feeds every Pow (RMSNorm) and consumes every Softmax.
        cons = _consumers(m)
        for n in m.graph.node:
            if n.op_type == "Pow":
                assert producers[n.input[0]].op_type == "Cast"
            if n.op_type == "Softmax":
                assert [c.op_type for c in cons[n.output[0]]] == ["Cast"]
    # In the fp16 variant the boundaries are real conversions (fp16 <-> fp32).
    m16 = models["fp16-autocast"]
    to = Counter(n.attribute[0].i for n in m16.graph.node if n.op_type == "Cast")
    assert to[TensorProto.FLOAT] >= 2 * CFG.layers + 1 and to[TensorProto.FLOAT16] >= 2 * CFG.layers + 1


def test_deterministic_and_seeded() -> None:
    a, b = make_llama(CFG, "fp32", seed=0), make_llama(CFG, "fp32", seed=0)
    assert a.SerializeToString() == b.SerializeToString()
    c = make_llama(CFG, "fp32", seed=1)
    wa, wc = _weights(a), _weights(c)
    assert not np.array_equal(wa["lm_head.weight"], wc["lm_head.weight"])
    with pytest.raises(ValueError, match="variant"):
        make_llama(CFG, "int8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kv_heads"):
        LlamaConfig(heads=8, kv_heads=3)


def test_bigger_config_runs(rng: np.random.Generator) -> None:
    m = make_llama(BIGGER, "fp16-autocast")
    onnx.checker.check_model(m)
    ids = rng.integers(0, BIGGER.vocab, size=(2, 7), dtype=np.int64)
    out = _run(m, ids)
    assert out.shape == (2, 7, BIGGER.vocab) and np.isfinite(out).all()


def test_hf_config_and_make_example(tmp_path: Path) -> None:
    from trtforge.examples.make_example import main

    cfg = hf_config(CFG)
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]) == (2, 256, 8, 2, 32, 688, 1024)
    for key in ("max_position_embeddings", "rms_norm_eps", "rope_theta", "torch_dtype"):
        assert key in cfg
    out = tmp_path / "ex"
    assert main([str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "llama_fp16_autocast.onnx", "llama_fp32.onnx"]
    assert json.loads((out / "config.json").read_text()) == cfg
    loaded = onnx.load(str(out / "llama_fp32.onnx"))
    assert loaded.SerializeToString() == make_llama(CFG, "fp32").SerializeToString()


def test_tensorrt_rtx_parses_fp32(models: dict[str, onnx.ModelProto], tmp_path: Path) -> None:
    """TensorRT-RTX's ONNX parser accepts the fp32 example (parse only; building is the builder's test)."""
    trt = pytest.importorskip("tensorrt_rtx")
    from trtforge.build_engine.engine.backend import prepare_plugin_loading, select_backend

    prepare_plugin_loading(select_backend("tensorrt-rtx"))
    path = tmp_path / "llama.onnx"
    onnx.save(models["fp32"], str(path))
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(str(path))
    errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
    assert ok, errors
    assert network.num_inputs == 1 and network.get_input(0).name == "input_ids"
    assert network.num_outputs == 1 and network.get_output(0).name == "logits"
    assert tuple(network.get_input(0).shape) == (-1, -1)
