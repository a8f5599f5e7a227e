"""Gemm projections (a ``Linear`` exported with 2-D inputs): quantized as MatMul (+ Add) when alpha = beta = 1,
transA = 0 and B is a 2-D float32 initializer; every other Gemm, and a Gemm the selection keeps float (LM head,
--exclude), stays the same Gemm node and is reported. Anchored to the MatMul path: quantizing the Gemm model gives
the same stored tensors and the same outputs as quantizing its MatMul + Add form written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.cli import main
from trtforge.build_engine.quantize.targets import GEMM_BIAS_DOC

K, N, M, H, ROWS = 64, 48, 32, 16, 5


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"wg": (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32),  # [out, in]: transB=1
            "b": rng.standard_normal(N).astype(np.float32),
            "w2": (rng.standard_normal((N, M)) / np.sqrt(N)).astype(np.float32),  # [in, out]: transB=0, no C
            "w3": (rng.standard_normal((H, M)) / np.sqrt(M)).astype(np.float32),  # the head, transB=1
            "b3": rng.standard_normal((1, H)).astype(np.float32)}


def _model(w: dict[str, np.ndarray], as_matmul: bool = False, **gemm1: float) -> onnx.ModelProto:
    """x -> Gemm(wg^T, b) -> Relu -> Gemm(w2) -> Tanh -> Gemm(w3^T, b3) = y (the LM head); ``as_matmul``: the same
    written as MatMul (+ Add) with the transposed weights stored."""
    inits = dict(w)
    if as_matmul:
        inits["wg"], inits["w3"] = w["wg"].T.copy(), w["w3"].T.copy()
        nodes = [helper.make_node("MatMul", ["x", "wg"], ["h0"], name="gemm1"),
                 helper.make_node("Add", ["h0", "b"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                 helper.make_node("MatMul", ["r", "w2"], ["y0"], name="gemm2"),
                 helper.make_node("Tanh", ["y0"], ["t"]), helper.make_node("MatMul", ["t", "w3"], ["y1"], name="head"),
                 helper.make_node("Add", ["y1", "b3"], ["y"])]
    else:
        nodes = [helper.make_node("Gemm", ["x", "wg", "b"], ["h"], name="gemm1", transB=1, **gemm1),
                 helper.make_node("Relu", ["h"], ["r"]),
                 helper.make_node("Gemm", ["r", "w2"], ["y0"], name="gemm2"),
                 helper.make_node("Tanh", ["y0"], ["t"]),
                 helper.make_node("Gemm", ["t", "w3", "b3"], ["y"], name="head", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, H])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _quantize(tmp_path: Path, model: onnx.ModelProto, mode: str, tag: str, *extra: str) -> tuple[Path, dict]:
    """``trtforge quantize`` calibrated on 8 standard-normal samples (the distribution the tests then feed)."""
    src, out, rep = tmp_path / f"{tag}.onnx", tmp_path / f"{tag}_{mode}.onnx", tmp_path / f"{tag}_{mode}.json"
    onnx.save(model, src)
    calib = tmp_path / "calib.npz"
    if not calib.exists():
        np.savez(calib, x=np.random.default_rng(0).standard_normal((8, ROWS, K)).astype(np.float32))
    code = main(["quantize", str(src), "-o", str(out), "--mode", mode, "--calib", str(calib), "--block-size", "16",
                 "--report", str(rep), *extra])
    assert code == 0
    return out, json.loads(rep.read_text())


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    """onnxruntime with graph optimizations off, as ``trtforge diff`` runs it: onnxruntime 1.32's CPU optimizations
    at the EXTENDED level and above compute fp8 Q/DQ MatMuls wrong (max abs 1.85 against onnx.reference here)."""
    from trtforge.build_engine.verify.sessions import make_session

    return np.asarray(make_session(str(path)).run(None, {"x": x})[0])


@pytest.mark.parametrize("mode", ["int8", "int4-wo", "fp8"])
def test_gemm_quantized_as_its_matmul_form(mode: str, tmp_path: Path, rng: np.random.Generator) -> None:
    w = _weights(rng)
    out, report = _quantize(tmp_path, _model(w), mode, "gemm")
    ref, ref_report = _quantize(tmp_path, _model(w, as_matmul=True), mode, "matmul")
    assert [n["name"] for n in report["nodes"]] == ["gemm1", "gemm2"]
    assert [n["name"] for n in ref_report["nodes"]] == ["gemm1", "gemm2"]
    assert {e["name"]: e["reason"] for e in report["excluded"]} == {"head": "LM head (pass --quantize-lm-head to "
                                                                           "quantize it)"}
    q = onnx.load(out)
    onnx.checker.check_model(q, full_check=True)
    ops = {n.name: n for n in q.graph.node}
    assert ops["gemm1"].op_type == ops["gemm2"].op_type == "MatMul" and ops["head"].op_type == "Gemm"
    assert [n.doc_string for n in q.graph.node if n.op_type == "Add"] == [GEMM_BIAS_DOC]
    names = {t.name for t in q.graph.initializer}
    assert "wg" not in names and "w3" in names  # no float copy of a quantized weight; the head's is its own
    # Same stored tensors as the MatMul path (wg^T is stored as "wg_transposed_*" here, as "wg_*" there).
    got = {t.name.replace("wg_transposed", "wg"): numpy_helper.to_array(t) for t in q.graph.initializer}
    want = {t.name: numpy_helper.to_array(t) for t in onnx.load(ref).graph.initializer}
    for name in set(want) - {"w3"}:
        assert got[name].tobytes() == want[name].tobytes(), name
    x = rng.standard_normal((ROWS, K)).astype(np.float32)
    y, y_ref = _run(out, x), _run(ref, x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)  # the head: Gemm vs MatMul + Add kernels
    y_float = _run(tmp_path / "gemm.onnx", x).astype(np.float64)
    assert np.linalg.norm(y - y_float) / np.linalg.norm(y_float) < {"int8": 0.1, "fp8": 0.15, "int4-wo": 0.35}[mode]


def test_gemm_lm_head_quantized_on_request(tmp_path: Path, rng: np.random.Generator) -> None:
    out, report = _quantize(tmp_path, _model(_weights(rng)), "int8", "gemm", "--quantize-lm-head")
    assert [n["name"] for n in report["nodes"]] == ["gemm1", "gemm2", "head"] and not report["excluded"]
    assert "Gemm" not in {n.op_type for n in onnx.load(out).graph.node}


@pytest.mark.parametrize(("attrs", "reason"), [({"alpha": 0.5}, "alpha != 1"), ({"beta": 2.0}, "beta != 1")])
def test_gemm_that_cannot_be_lowered_stays_the_same_gemm(attrs: dict[str, float], reason: str, tmp_path: Path,
                                                         rng: np.random.Generator) -> None:
    model = _model(_weights(rng), **attrs)
    out, report = _quantize(tmp_path, model, "int8", "gemm")
    excluded = {e["name"]: e["reason"] for e in report["excluded"]}
    assert reason in excluded["gemm1"] and [n["name"] for n in report["nodes"]] == ["gemm2"]
    before = next(n for n in model.graph.node if n.name == "gemm1")
    after = next(n for n in onnx.load(out).graph.node if n.name == "gemm1")
    assert after.SerializeToString() == before.SerializeToString()


def test_excluded_gemm_stays_a_gemm(tmp_path: Path, rng: np.random.Generator) -> None:
    out, report = _quantize(tmp_path, _model(_weights(rng)), "fp8", "gemm", "--exclude", "gemm1")
    assert {e["name"]: e["reason"] for e in report["excluded"]}["gemm1"] == "--exclude 'gemm1'"
    q = onnx.load(out)
    assert next(n for n in q.graph.node if n.name == "gemm1").op_type == "Gemm"
    assert "wg" in {t.name for t in q.graph.initializer}


def test_lora_injected_gemm_is_quantized_and_the_plugin_reads_float_x(tmp_path: Path, rng: np.random.Generator,
                                                                      cli) -> None:
    """lora inject accepts a Gemm projection; quantize then lowers it: the plugin still reads the float x and the
    Gemm's output (the bias Add's now), and with no adapter (slot -1) the output passes the int8 preset."""
    w = _weights(rng)
    src = tmp_path / "gemm.onnx"
    onnx.save(_model(w), src)
    assert cli("lora", "inject", src, "-o", tmp_path / "lora.onnx", "--targets", "gemm1", "--max-rank", "8",
               "--slots", "2").code == 0
    out = tmp_path / "lora_int8.onnx"
    assert cli("quantize", tmp_path / "lora.onnx", "-o", out, "--mode", "int8", "--calib-size", "4",
               "--report", tmp_path / "r.json").code == 0  # calibration generated: the pools are inputs too
    assert [n["name"] for n in json.loads((tmp_path / "r.json").read_text())["nodes"]] == ["gemm1", "gemm2"]
    q = onnx.load(out)
    plugin = next(n for n in q.graph.node if n.op_type == "LoRAOpPluginDynamic")
    add = next(n for n in q.graph.node if n.doc_string == GEMM_BIAS_DOC)
    assert plugin.input[0] == "x" and add.output[0] in plugin.input
    res = cli("diff", tmp_path / "lora.onnx", out, "--precision", "int8", "--value", "lora_slot_ids=-1")
    assert res.code == 0, res.err
