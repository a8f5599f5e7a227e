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


def _sqrt(absolute: bool) -> onnx.ModelProto:
    """y = Sqrt(x) (NaN for the negative inputs the default range [-1, 1] draws), or Sqrt(Abs(x))."""
    nodes = [helper.make_node("Abs", ["x"], ["ax"]), helper.make_node("Sqrt", ["ax"], ["y"])] if absolute else [
        helper.make_node("Sqrt", ["x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nans_both_outputs_share_are_no_relative_error(tmp_path: Path) -> None:
    # old: a model with NaN outputs diffed against itself had whole-output relative error inf in the table (null in
    # the summary JSON), though the outputs are identical; shared NaNs now count in neither norm (error 0), while
    # the element-wise rule still counts each NaN as a mismatch; a NaN against a number is still error inf
    m, m_abs = tmp_path / "m.onnx", tmp_path / "m_abs.onnx"
    onnx.save(_sqrt(False), m)
    onnx.save(_sqrt(True), m_abs)
    res = run_diff(m, m)
    (y,) = res.outputs
    assert y.nans > 0 and y.mismatches == y.nans and not res.passed
    assert y.rel_error == 0.0 and y.max_abs == 0.0
    other = run_diff(m, m_abs).outputs[0]
    assert other.rel_error == float("inf") and not other.passed
    # under a quantized preset the whole-output numbers pass, and the NaNs alone fail it, as the verdict says
    from trtforge.build_engine.core.errors import CheckFailed
    from trtforge.build_engine.verify.diff import check

    quant = run_diff(m, m, precision="int8")
    assert quant.outputs[0].rel_error == 0.0 and not quant.passed
    try:
        check(quant)
    except CheckFailed as e:
        assert "hold NaN (the int8 preset's numbers pass)" in str(e) and "1e+30" not in str(e)
    else:
        raise AssertionError("an output holding NaN passed the int8 preset")


def test_integer_outputs_follow_the_documented_tolerances(tmp_path: Path) -> None:
    # the help text and README say integer outputs (token ids) are judged by the same atol/rtol (ids 5000 vs 5001
    # pass fp16, as Polygraphy's rule has it) and that --atol 0 --rtol 0 compares them exactly
    paths = []
    for v in (5000, 5001):
        ids = helper.make_node("Constant", [], ["y"], value=numpy_helper.from_array(np.array([v], np.int64)))
        graph = helper.make_graph([ids], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.INT64, [1])])
        paths.append(tmp_path / f"ids{v}.onnx")
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), paths[-1])
    assert run_diff(*paths, precision="fp16").passed
    assert not run_diff(*paths, atol=0.0, rtol=0.0).passed
