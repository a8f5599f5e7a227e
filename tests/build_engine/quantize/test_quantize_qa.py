"""Held-out QA of trtforge quantize on two-projection models built here (fresh random weights per test):
non-finite weights are refused, weights fed as graph inputs stay float, all-zero activations get a positive scale,
and the stored values are the documented arithmetic (int8 per channel, int4 nibble packing)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.cli import main
from trtforge_testing import CliResult, assert_one_line_error

K, N, M = 64, 48, 32


def _model(w1: np.ndarray, w2: np.ndarray, weight_input: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="proj1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y0"], name="proj2"),
             helper.make_node("Tanh", ["y0"], ["y"], name="tanh")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, K])]
    if weight_input:
        ins.append(helper.make_tensor_value_info("w1", TensorProto.FLOAT, [K, N]))
    graph = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, M])],
                              [numpy_helper.from_array(w1.astype(np.float32), "w1"),
                               numpy_helper.from_array(w2.astype(np.float32), "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _quantize(tmp_path: Path, model: onnx.ModelProto, mode: str, capsys: pytest.CaptureFixture[str],
              *extra: str) -> tuple[CliResult, Path]:
    src, out = tmp_path / "in.onnx", tmp_path / f"out_{mode}.onnx"
    onnx.save(model, src)
    code = main(["quantize", str(src), "-o", str(out), "--mode", mode, "--calib-size", "3", "--block-size", "16",
                 "--report", str(tmp_path / "report.json"), *extra])
    cap = capsys.readouterr()
    return CliResult(code, cap.out, cap.err), out


def _session(path: Path) -> object:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("mode", "bad"), [("int8", np.nan), ("int4-wo", np.inf), ("fp8", -np.inf)])
def test_non_finite_weight_is_refused(mode: str, bad: float, tmp_path: Path, rng: np.random.Generator,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    w1 = rng.standard_normal((K, N))
    w1[rng.integers(K), rng.integers(N)] = bad
    res, out = _quantize(tmp_path, _model(w1, rng.standard_normal((N, M))), mode, capsys)
    assert_one_line_error(res, 2, "proj1", "NaN or infinite")
    assert not out.exists()


def test_weight_fed_as_graph_input_stays_float(tmp_path: Path, rng: np.random.Generator,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    w1, w2 = rng.standard_normal((K, N)), rng.standard_normal((N, M))
    res, out = _quantize(tmp_path, _model(w1, w2, weight_input=True), "int8", capsys)
    assert res.code == 0, res.err
    q = onnx.load(out)
    assert next(n for n in q.graph.node if n.name == "proj1").input[1] == "w1"
    excluded = {e["name"]: e["reason"] for e in json.loads((tmp_path / "report.json").read_text())["excluded"]}
    assert "graph input" in excluded["proj1"]
    # The fed value is honoured: feeding another w1 changes the output exactly as the float model's does.
    x = rng.standard_normal((1, 5, K)).astype(np.float32)
    other = rng.standard_normal((K, N)).astype(np.float32)
    a = _session(out).run(None, {"x": x, "w1": w1.astype(np.float32)})[0]  # type: ignore[attr-defined]
    b = _session(out).run(None, {"x": x, "w1": other})[0]  # type: ignore[attr-defined]
    assert np.abs(a - b).max() > 0.1


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_all_zero_activation_gets_a_positive_scale(mode: str, tmp_path: Path, rng: np.random.Generator,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    w1 = -np.abs(rng.standard_normal((K, N)))  # x >= 0 below: relu(x @ w1) is all zeros on every sample
    npz = tmp_path / "calib.npz"
    np.savez(npz, x=np.abs(rng.standard_normal((3, 1, 5, K))).astype(np.float32))
    res, out = _quantize(tmp_path, _model(w1, rng.standard_normal((N, M))), mode, capsys, "--calib", str(npz))
    assert res.code == 0, res.err
    q = onnx.load(out)
    onnx.checker.check_model(q, full_check=True)
    scales = [numpy_helper.to_array(t) for t in q.graph.initializer if t.name.endswith("_act_scale")]
    assert len(scales) == 2 and all(float(s) > 0 for s in scales), scales
    x = np.abs(rng.standard_normal((1, 5, K))).astype(np.float32)
    y = _session(out).run(None, {"x": x})[0]  # type: ignore[attr-defined]
    assert np.all(np.isfinite(y))


def _unpack_int4(t: onnx.TensorProto) -> np.ndarray:
    raw = np.frombuffer(t.raw_data, np.uint8)
    v = np.stack([raw & 0xF, raw >> 4], -1).reshape(-1)[: int(np.prod(t.dims))].astype(np.int8)
    return np.where(v > 7, v - 16, v).reshape(tuple(t.dims))


@pytest.mark.parametrize("mode", ["int8", "int4-wo"])
def test_stored_weights_are_the_documented_arithmetic(mode: str, tmp_path: Path, rng: np.random.Generator,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    w1 = rng.standard_normal((K, N)) * rng.uniform(0.1, 3.0, (K, 1))
    res, out = _quantize(tmp_path, _model(w1, rng.standard_normal((N, M))), mode, capsys, "--int4-method", "rtn")
    assert res.code == 0, res.err
    inits = {t.name: t for t in onnx.load(out).graph.initializer}
    inv = (numpy_helper.to_array(inits["x_migration_inv_scale"]).astype(np.float64) if mode == "int8"
           else np.ones(K))  # rtn: no migration Mul
    assert ("x_migration_inv_scale" in inits) == (mode == "int8")
    ws = w1.astype(np.float32).astype(np.float64) / inv[:, None]
    scale = numpy_helper.to_array(inits["w1_scale"]).astype(np.float64)
    assert inits["w1_scale"].data_type == TensorProto.FLOAT
    if mode == "int8":
        np.testing.assert_allclose(scale, np.abs(ws).max(0) / 127, rtol=1e-5)
        q = numpy_helper.to_array(inits["w1_quantized"]).astype(np.float64)
        full = scale[None, :]
        lo = -127
    else:
        np.testing.assert_allclose(scale, np.abs(ws).reshape(K // 16, 16, N).max(1) / 7, rtol=1e-5)
        q = _unpack_int4(inits["w1_quantized"]).astype(np.float64)  # low nibble first, two's complement
        full = np.repeat(scale, 16, axis=0)
        lo = -8
    mismatch = q != np.clip(np.rint(ws / full), lo, 127 if mode == "int8" else 7)
    assert mismatch.mean() < 1e-3 and q.min() < 0 < q.max()  # ties may round differently in float32
