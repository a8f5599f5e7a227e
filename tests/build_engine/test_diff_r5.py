"""trtforge diff, round 5: numbers the table and the quantized presets state for held-out outputs (real Polygraphy
Comparator runs over real onnxruntime sessions on tiny models built here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.verify.compare import compare_arrays
from trtforge.build_engine.verify.diff import run_diff


def _masked_logits(k: float) -> onnx.ModelProto:
    """y = x * k + mask, the mask -inf on the last 3 of 8 logits (a logits processor's banned tokens)."""
    mask = np.zeros((1, 8), np.float32)
    mask[0, 5:] = -np.inf
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("Add", ["m", "mask"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.float32(k), "k"), numpy_helper.from_array(mask, "mask")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_masked_logits_relative_error_ignores_the_shared_infinities(tmp_path: Path) -> None:
    # old: one -inf in B made ||B|| and max|B| inf, so outputs 3x apart had relative error 0 and rel to scale 0
    # and passed --precision int8 (exit 0); the same infinity in both now counts in neither norm
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(_masked_logits(3.0), a)
    onnx.save(_masked_logits(1.0), b)
    res = run_diff(a, b, precision="int8")
    (y,) = res.outputs
    out_a = np.asarray(res.run_results[f"A:{a.name}"][0]["y"], np.float64)
    out_b = np.asarray(res.run_results[f"B:{b.name}"][0]["y"], np.float64)
    finite = np.isfinite(out_b)
    assert np.array_equal(np.isinf(out_a), ~finite)
    expect = np.linalg.norm(out_a[finite] - out_b[finite]) / np.linalg.norm(out_b[finite])
    assert abs(expect - 2.0) < 1e-6
    assert abs(y.rel_error - expect) < 1e-9 and not y.passed and not res.passed
    assert abs(y.rel_to_scale - np.abs(out_a[finite] - out_b[finite]).max() / np.abs(out_b[finite]).max()) < 1e-9
    # a model against itself still has error 0 (the shared infinities are not a difference)
    same = run_diff(b, b, precision="int8")
    assert same.passed and same.outputs[0].rel_error == 0.0 and same.outputs[0].rel_to_scale == 0.0


def test_rel_to_scale_is_against_the_largest_finite_reference_value() -> None:
    d = compare_arrays(np.array([2.0, -np.inf], np.float32), np.array([1.0, -np.inf], np.float32), 1e-5, 1e-5)
    assert d.max_abs == 1.0 and d.rel_to_scale == 1.0
    # an infinity only one side has is an infinite difference, whatever the scale
    d = compare_arrays(np.array([1.0, 0.0], np.float32), np.array([1.0, -np.inf], np.float32), 1e-5, 1e-5)
    assert d.max_abs == np.inf and d.rel_to_scale == np.inf


def test_a_sequence_output_is_one_clear_error(tmp_path: Path, cli) -> None:
    # old: 'running a.onnx / a.onnx failed: Function: dtype is unsupported for objects of type: list; check the models
    # run in onnxruntime ...' for a model onnxruntime runs (Polygraphy's comparator takes tensors only)
    from trtforge_testing import assert_one_line_error

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("SequenceConstruct", ["a", "x"], ["seq"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)])
    path = tmp_path / "a.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    res = cli("diff", path, path, "--save", tmp_path / "r.json")
    assert_one_line_error(res, 2, "output 'seq' is a sequence", "tensor outputs only")
    assert not list(tmp_path.glob("r*.json"))
