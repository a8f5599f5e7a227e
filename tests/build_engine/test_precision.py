"""Precision conversion on the example Llama: real onnxruntime / onnx.reference runs against the fp32 model."""

from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from trtforge.build_engine.precision.convert import convert_precision
from trtforge.build_engine.precision.policy import KEEP_OPS
from trtforge.examples.llama import LlamaConfig, make_llama
from trtforge_testing import assert_one_line_error

T = onnx.TensorProto
LOW = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16}
# Max abs error over max abs fp32 output (logits). Measured on this model: fp16 ~1e-3, bf16 ~1e-2.
TOL = {"fp16": 5e-3, "bf16": 3e-2}


@pytest.fixture(scope="module")
def fp32_model() -> onnx.ModelProto:
    return make_llama()


@pytest.fixture(scope="module")
def converted(fp32_model: onnx.ModelProto) -> dict[str, onnx.ModelProto]:
    return {to: convert_precision(fp32_model, to).model for to in ("fp16", "bf16")}


def _ids(cfg: LlamaConfig = LlamaConfig(), shape: tuple[int, int] = (2, 11)) -> tuple[np.ndarray, int]:
    seed = secrets.randbits(32)
    ids = np.random.default_rng(seed).integers(1, cfg.vocab, size=shape, dtype=np.int64)
    return ids, seed


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def _types(model: onnx.ModelProto) -> dict[str, int]:
    m = onnx.shape_inference.infer_shapes(model)
    g = m.graph
    out = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]}
    out.update({t.name: t.data_type for t in g.initializer})
    return out


@pytest.mark.parametrize("shape", [(2, 11), (1, 500)])  # 500: late positions, where rotary angles need fp32
def test_fp16_within_tolerance_onnxruntime(fp32_model: onnx.ModelProto, converted: dict, shape: tuple) -> None:
    import onnxruntime as ort

    ids, seed = _ids(shape=shape)
    ref = ort.InferenceSession(fp32_model.SerializeToString()).run(None, {"input_ids": ids})[0]
    out = ort.InferenceSession(converted["fp16"].SerializeToString()).run(None, {"input_ids": ids})[0]
    assert out.dtype == np.float32 and out.shape == ref.shape
    rel = _rel(out, ref)
    print(f"fp16 vs fp32 (onnxruntime) relative error {rel:.2e} (seed {seed})")
    assert np.isfinite(out).all() and rel < TOL["fp16"], (rel, seed)


@pytest.mark.parametrize("to", ["fp16", "bf16"])
def test_within_tolerance_onnx_reference(fp32_model: onnx.ModelProto, converted: dict, to: str) -> None:
    """onnxruntime's CPU provider has no bf16 MatMul, so bf16 (and fp16, exactly typed) runs in onnx.reference."""
    ids, seed = _ids(shape=(1, 9))
    ref = ReferenceEvaluator(fp32_model).run(None, {"input_ids": ids})[0]
    out = ReferenceEvaluator(converted[to]).run(None, {"input_ids": ids})[0]
    rel = _rel(out, ref)
    print(f"{to} vs fp32 (onnx.reference) relative error {rel:.2e} (seed {seed})")
    assert out.dtype == np.float32 and np.isfinite(out).all() and rel < TOL[to], (rel, seed)


@pytest.mark.parametrize("to", ["fp16", "bf16"])
def test_structure(fp32_model: onnx.ModelProto, converted: dict, to: str) -> None:
    model = converted[to]
    onnx.checker.check_model(model, full_check=True)
    # Graph I/O dtypes are the original ones, so the engine's I/O matches the fp32 model.
    assert [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input] == \
        [(i.name, i.type.tensor_type.elem_type) for i in fp32_model.graph.input]
    assert [(o.name, o.type.tensor_type.elem_type) for o in model.graph.output] == \
        [(o.name, o.type.tensor_type.elem_type) for o in fp32_model.graph.output]
    types = _types(model)
    low = LOW[to]
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    projections = [n for n in matmuls if n.name.endswith("_proj/MatMul")]
    assert len(projections) == 7 * LlamaConfig().layers
    for n in projections:  # the compute runs in the low type, weights stored in the low type
        assert types[n.input[0]] == low and types[n.input[1]] == low and types[n.output[0]] == low, n.name
    weights = {t.name: t.data_type for t in model.graph.initializer}
    assert all(dt != T.FLOAT for name, dt in weights.items()
               if name.endswith("_proj.weight") or "_proj.weight_" in name)
    # Sensitive ops see only fp32 inputs (RMSNorm Pow/ReduceMean/Sqrt, Softmax, rotary Sin/Cos).
    sensitive = [n for n in model.graph.node if n.op_type in KEEP_OPS]
    assert {n.op_type for n in sensitive} >= {"Pow", "ReduceMean", "Sqrt", "Softmax", "Sin", "Cos"}
    for n in sensitive:
        for x in n.input:
            if x and types.get(x) in (T.FLOAT, T.FLOAT16, T.BFLOAT16):
                assert types[x] == T.FLOAT, (n.op_type, n.name, x)


@pytest.mark.parametrize("to", ["fp16", "bf16"])
def test_rotary_angles_and_weights(converted: dict, to: str) -> None:
    """Rotary angles (positions * inv_freq) are computed in fp32 end to end: at position ~1000 a bf16 angle is off by
    up to 4 rad. And every big weight (projections, embedding, lm_head) is stored in the low type."""
    model = converted[to]
    types = _types(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    for trig in (n for n in model.graph.node if n.op_type in ("Sin", "Cos")):
        seen, todo = set(), list(trig.input)
        while todo:
            name = todo.pop()
            if name in seen or not name:
                continue
            seen.add(name)
            assert types.get(name) not in (T.FLOAT16, T.BFLOAT16), (trig.name, name)
            if name in producer:
                todo.extend(producer[name].input)
        assert any("inv_freq" in v for v in seen), seen
    big_fp32 = [t.name for t in model.graph.initializer
                if t.data_type == T.FLOAT and int(np.prod(t.dims)) >= LlamaConfig().hidden * 4]
    assert big_fp32 == [], big_fp32


@pytest.mark.parametrize("to", ["fp16", "bf16"])
def test_no_redundant_cast_left(converted: dict, to: str) -> None:
    model = converted[to]
    types = _types(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    embeds = {(T.FLOAT16, T.FLOAT), (T.BFLOAT16, T.FLOAT)}  # (T, U): U holds every T exactly
    for n in model.graph.node:
        if n.op_type != "Cast":
            continue
        to_type = n.attribute[0].i
        assert types.get(n.input[0]) != to_type, f"Cast to its own type left: {n.name}"
        p = producer.get(n.input[0])
        if p is not None and p.op_type == "Cast":
            assert not ((types.get(p.input[0]), p.attribute[0].i) in embeds and types.get(p.input[0]) == to_type), \
                f"round trip left: {p.name} -> {n.name}"


def test_large_activations_stay_within_tolerance(fp32_model: onnx.ModelProto) -> None:
    """Embeddings scaled to ~700 make x**2 ~ 5e5 > fp16 max inside every RMSNorm."""
    model = onnx.ModelProto()
    model.CopyFrom(fp32_model)
    emb = next(t for t in model.graph.initializer if t.name == "model.embed_tokens.weight")
    w = onnx.numpy_helper.to_array(emb)
    emb.CopyFrom(onnx.numpy_helper.from_array((w * (700.0 / np.abs(w).max())).astype(np.float32), emb.name))
    ids, seed = _ids(shape=(1, 7))
    ref = ReferenceEvaluator(model).run(None, {"input_ids": ids})[0]
    good = ReferenceEvaluator(convert_precision(model, "fp16").model).run(None, {"input_ids": ids})[0]
    rel = _rel(good, ref)
    print(f"large activations: fp16 with fp32 norms {rel:.2e} (seed {seed})")
    assert np.isfinite(good).all() and rel < TOL["fp16"], (rel, seed)


def _rmsnorm_model(hidden: int = 64) -> onnx.ModelProto:
    """x -> Pow/ReduceMean/Add/Sqrt/Div -> Mul(w) -> MatMul: an RMSNorm as exporters write it, without Casts."""
    h = onnx.helper
    rng = np.random.default_rng(secrets.randbits(32))
    inits = [
        onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        onnx.numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        onnx.numpy_helper.from_array(rng.uniform(0.5, 1.5, hidden).astype(np.float32), "w"),
        onnx.numpy_helper.from_array((rng.standard_normal((hidden, hidden)) * 0.1).astype(np.float32), "proj"),
    ]
    nodes = [
        h.make_node("Pow", ["x", "two"], ["sq"]), h.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        h.make_node("Add", ["ms", "eps"], ["mse"]), h.make_node("Sqrt", ["mse"], ["rms"]),
        h.make_node("Div", ["x", "rms"], ["xn"]), h.make_node("Mul", ["xn", "w"], ["xw"]),
        h.make_node("MatMul", ["xw", "proj"], ["y"]),
    ]
    graph = h.make_graph(nodes, "rms", [h.make_tensor_value_info("x", T.FLOAT, ["batch", "sequence", hidden])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["batch", "sequence", hidden])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


def test_rmsnorm_island_prevents_fp16_overflow() -> None:
    """With the fp32 island the norm is right; the same conversion without it (keep_ops empty) overflows."""
    model = _rmsnorm_model()
    seed = secrets.randbits(32)
    x = (np.random.default_rng(seed).standard_normal((2, 5, 64)) * 700).astype(np.float32)
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    good = ReferenceEvaluator(convert_precision(model, "fp16").model).run(None, {"x": x})[0]
    naive = ReferenceEvaluator(convert_precision(model, "fp16", keep_ops=frozenset()).model).run(None, {"x": x})[0]
    rel_good, rel_naive = _rel(good, ref), _rel(naive, ref)
    print(f"RMSNorm at |x|~700: fp32 island {rel_good:.2e}, naive fp16 {rel_naive:.2e} (seed {seed})")
    assert rel_good < TOL["fp16"], (rel_good, seed)
    assert rel_naive > 0.5, (rel_naive, seed)  # x**2 overflows to inf, the norm divides by inf


def test_converting_twice_changes_nothing_more(converted: dict) -> None:
    again = convert_precision(converted["bf16"], "bf16")
    assert again.report.nodes_low == 0 and again.report.initializers_converted == 0


def test_fp16_autocast_variant_converts(fp32_model: onnx.ModelProto) -> None:
    import onnxruntime as ort

    model = convert_precision(make_llama(variant="fp16-autocast"), "fp16").model
    ids, seed = _ids()
    ref = ort.InferenceSession(fp32_model.SerializeToString()).run(None, {"input_ids": ids})[0]
    out = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids})[0]
    assert _rel(out, ref) < TOL["fp16"], seed


def test_cli(cli, tmp_path: Path, fp32_model: onnx.ModelProto) -> None:
    src, dst, rep = tmp_path / "m.onnx", tmp_path / "m16.onnx", tmp_path / "r.json"
    onnx.save(fp32_model, src)
    res = cli("precision", src, "-o", dst, "--to", "bf16", "--report", rep)
    assert res.code == 0, res.err
    assert "bf16" in res.out and dst.exists() and rep.exists()
    loaded = onnx.load(dst)
    assert any(t.data_type == T.BFLOAT16 for t in loaded.graph.initializer)
    bad = cli("precision", src, "-o", tmp_path / "x.onnx", "--to", "int8")
    assert_one_line_error(bad, 2, "--to")
    assert not (tmp_path / "x.onnx").exists()
    missing = cli("precision", tmp_path / "nope.onnx", "-o", tmp_path / "y.onnx", "--to", "fp16")
    assert_one_line_error(missing, 2, "nope.onnx")
