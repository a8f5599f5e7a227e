"""quantize, held-out QA round 10: a projection with an empty weight (a zero-size dim, valid ONNX) is excluded with
that reason (every mode exited 3: maxima over nothing); AWQ's error terms are summed in float64 (finite weights of
1e20 overflowed float32 squares: NaN errors in the report, numpy warnings on stderr); a refused output data file is
named as what it is (``-o out.onnx.data``: the user gave ``-o out.onnx``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error

MODES = ("int8", "int4-wo", "fp8")


def _model(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    nodes, outs = [], []
    for name, w in weights.items():
        nodes.append(helper.make_node("MatMul", ["x", name], [f"{name}_a"], name=f"mm_{name}"))
        nodes.append(helper.make_node("Relu", [f"{name}_a"], [f"{name}_y"]))  # not an LM head (graph output)
        outs.append(helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["b", w.shape[1]]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])], outs,
                          [numpy_helper.from_array(w, n) for n, w in weights.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("mode", MODES)
def test_an_empty_weight_is_excluded_and_the_others_quantized(tmp_path: Path, rng: np.random.Generator, cli,
                                                              mode: str) -> None:
    src, out, report = tmp_path / "m.onnx", tmp_path / "q.onnx", tmp_path / "r.json"
    onnx.save(_model({"empty": np.zeros((64, 0), np.float32),
                      "full": rng.standard_normal((64, 32)).astype(np.float32)}), src)
    res = cli("quantize", src, "-o", out, "--mode", mode, "--report", report)
    assert res.code == 0, res.err
    data = json.loads(report.read_text())
    assert [n["name"] for n in data["nodes"]] == ["mm_full"]
    assert any(e["name"] == "mm_empty" and "is empty (shape [64, 0])" in e["reason"] for e in data["excluded"])
    onnx.checker.check_model(onnx.load(out), full_check=True)


@pytest.mark.parametrize("mode", MODES)
def test_only_empty_weights_is_nothing_to_quantize(tmp_path: Path, cli, mode: str) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(_model({"empty": np.zeros((64, 0), np.float32)}), src)
    assert_one_line_error(cli("quantize", src, "-o", out, "--mode", mode), 2, "nothing to quantize", "is empty")
    assert not out.exists()


def test_awq_errors_are_finite_for_large_finite_weights(tmp_path: Path, rng: np.random.Generator, cli) -> None:
    src, out, report = tmp_path / "m.onnx", tmp_path / "q.onnx", tmp_path / "r.json"
    onnx.save(_model({"w": (rng.standard_normal((64, 32)) * 1e20).astype(np.float32)}), src)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's overflow warnings reached stderr
        res = cli("quantize", src, "-o", out, "--mode", "int4-wo", "--report", report)
    assert res.code == 0 and "Warning" not in res.err, res.err
    (node,) = json.loads(report.read_text())["nodes"]
    assert "nan" not in node["migration"] and "awq" in node["migration"], node["migration"]


def test_awq_squares_match_float64(rng: np.random.Generator) -> None:
    from trtforge.build_engine.quantize.awq import _squares

    a = (rng.standard_normal((8, 16)) * 1e20).astype(np.float32)
    b = (rng.standard_normal((8, 16)) * 1e20).astype(np.float32)
    expect = float(np.sum((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    assert np.isfinite(_squares(a, b)) and _squares(a, b) == pytest.approx(expect, rel=1e-12)
    assert _squares(a) == pytest.approx(float(np.sum(a.astype(np.float64) ** 2)), rel=1e-12)


@pytest.mark.parametrize("command", [("quantize", "--mode", "int8"), ("precision", "--to", "fp16")])
def test_a_refused_data_file_is_named_as_the_outputs_data(tmp_path: Path, rng: np.random.Generator, cli,
                                                          command: tuple[str, ...]) -> None:
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    model = _model({"w": rng.standard_normal((64, 32)).astype(np.float32)})
    onnx.save(model, src, save_as_external_data=True, location="out.onnx.data", size_threshold=0)
    before = (tmp_path / "out.onnx.data").read_bytes()
    res = cli(command[0], src, "-o", out, *command[1:])
    assert_one_line_error(res, 2, "-o's data file", "out.onnx.data", "choose another -o path")
    assert "-o out.onnx.data" not in res.err
    assert (tmp_path / "out.onnx.data").read_bytes() == before and not out.exists()
