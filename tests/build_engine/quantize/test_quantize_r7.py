"""Round-7 QA regressions for trtforge quantize: models whose graph input is bfloat16 (cast to float32 inside), with
generated samples and with a sample file (``numpy.savez`` writes bfloat16 arrays as raw ``|V2`` bytes)."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

H = 32


def _bf16_input_model(rng: np.random.Generator) -> onnx.ModelProto:
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("MatMul", ["xf", "w1"], ["a"], name="up"),
             helper.make_node("Relu", ["a"], ["r"], name="act"),
             helper.make_node("MatMul", ["r", "w2"], ["b"], name="down"),
             helper.make_node("Add", ["b", "xf"], ["y"], name="residual")]
    inits = [numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), n) for n in ("w1", "w2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, H])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _act_scales(path: Path) -> dict[str, float]:
    model = onnx.load(path)
    return {t.name: float(numpy_helper.to_array(t)) for t in model.graph.initializer if t.name.endswith("_act_scale")}


@pytest.mark.parametrize("mode", ["int8", "fp8", "int4-wo"])
def test_bf16_input_model_calibrates_from_generated_samples(tmp_path: Path, rng: np.random.Generator, cli,
                                                            mode: str) -> None:
    # old: 'calibration: onnxruntime cannot run the model on a sample (Numpy_type 256 can't be converted to
    # MLDataType.); check the calibration inputs' shapes', exit 2, in every mode
    src, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(_bf16_input_model(rng), src)
    res = cli("quantize", src, "-o", out, "--mode", mode)
    assert res.code == 0, res.err
    assert "2 projections quantized" in res.out
    onnx.checker.check_model(onnx.load(out), full_check=True)


def test_bf16_sample_file_sets_the_activation_range(tmp_path: Path, rng: np.random.Generator, cli) -> None:
    # old: '--calib s.npz: input 'x' has dtype |V2; the model takes bfloat16', exit 2
    src, out, calib, report = (tmp_path / n for n in ("m.onnx", "q.onnx", "s.npz", "r.json"))
    onnx.save(_bf16_input_model(rng), src)
    x = (rng.standard_normal((5, 4, H)) * 3).astype(ml_dtypes.bfloat16)
    np.savez(calib, x=x)
    res = cli("quantize", src, "-o", out, "--mode", "fp8", "--calib", calib, "--report", report)
    assert res.code == 0, res.err
    up = next(n for n in json.loads(report.read_text())["nodes"] if n["name"] == "up")
    amax = float(np.abs(x.astype(np.float64)).max())  # fp8: no migration, the max calibrator's range is max |x|
    assert up["act_amax"] == pytest.approx(amax, rel=1e-6)
    assert _act_scales(out)[f"{up['activation']}_act_scale"] == pytest.approx(amax / 448.0, rel=1e-6)


def test_bf16_sample_file_with_nan_is_refused(tmp_path: Path, rng: np.random.Generator, cli) -> None:
    from trtforge_testing import assert_one_line_error

    src, out, calib = (tmp_path / n for n in ("m.onnx", "q.onnx", "s.npz"))
    onnx.save(_bf16_input_model(rng), src)
    x = rng.standard_normal((2, 4, H)).astype(ml_dtypes.bfloat16)
    x[1, 2, 3] = np.nan
    np.savez(calib, x=x)
    assert_one_line_error(cli("quantize", src, "-o", out, "--mode", "int8", "--calib", calib), 2, "NaN")
    assert not out.exists()

