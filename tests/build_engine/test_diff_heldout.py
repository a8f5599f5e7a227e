"""Held-out diff inputs (QA session 24): outputs with +-inf, -0.0, int and bool outputs. A model with infinite
outputs compared with itself used to fail (inf - inf is NaN, which Polygraphy's default counts as a mismatch)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.verify.compare import compare_arrays
from trtforge_testing import assert_one_line_error, run_console


def _inf_model(path: Path, zero: float) -> Path:
    """y = x / 0 (+-inf for the random inputs), n = x * [zero, 0, 0] (-0.0 or +0.0), i = ArgMax, g = x > 0."""
    nodes = [h.make_node("Div", ["x", "Z"], ["y"]), h.make_node("Mul", ["x", "N"], ["n"]),
             h.make_node("ArgMax", ["x"], ["i"], axis=1), h.make_node("Greater", ["x", "K"], ["g"])]
    graph = h.make_graph(
        nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["batch", 3])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", 3]), h.make_tensor_value_info("n", T.FLOAT, ["batch", 3]),
         h.make_tensor_value_info("i", T.INT64, ["batch"]), h.make_tensor_value_info("g", T.BOOL, ["batch", 3])],
        [nh.from_array(np.zeros(3, np.float32), "Z"), nh.from_array(np.array([zero, 0, 0], np.float32), "N"),
         nh.from_array(np.zeros(3, np.float32), "K")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_equal_infinities_match(cli, tmp_path: Path) -> None:
    a = _inf_model(tmp_path / "a.onnx", -0.0)
    b = _inf_model(tmp_path / "b.onnx", 0.0)
    res = cli("diff", a, a)
    assert res.code == 0, res.err
    res = cli("diff", a, b)  # -0.0 against +0.0 is within any tolerance
    assert res.code == 0, res.err
    res = cli("diff", a, b, "--atol", "0", "--rtol", "0")  # but not bitwise equal
    assert_one_line_error(res, 1, "n (max abs 0, 2/6 mismatched")


def test_compare_arrays_infinities() -> None:
    inf = np.float32(np.inf)
    d = compare_arrays(np.array([inf, -inf, 1.0], np.float32), np.array([inf, -inf, 1.0], np.float32), 1e-5, 1e-5)
    assert (d.mismatches, d.max_abs) == (0, 0.0)
    d = compare_arrays(np.array([inf, np.nan], np.float32), np.array([-inf, np.nan], np.float32), 1e-5, 1e-5)
    assert d.mismatches == 2  # opposite infinities differ; NaN still never matches


def test_quantized_preset_on_bool_outputs(cli, tmp_path: Path) -> None:
    """A bool output's whole-output error is the share of differing elements: an equal one passed as inf (exit 1)."""
    a = _inf_model(tmp_path / "a.onnx", 0.0)
    assert cli("diff", a, a, "--precision", "int8").code == 0
    model = onnx.load(a)
    next(t for t in model.graph.initializer if t.name == "K").CopyFrom(nh.from_array(np.full(3, 9, np.float32), "K"))
    onnx.save(model, tmp_path / "b.onnx")  # g = x > 9: all False, unlike x > 0
    res = cli("diff", a, tmp_path / "b.onnx", "--precision", "int8")
    assert_one_line_error(res, 1, "fail the int8 preset", "g (relative error")


def test_input_dims_that_differ_are_exit_2(cli, tmp_path: Path) -> None:
    """x [batch, 3] against x [batch, 5]: was exit 1 'y (max abs inf, 6/6 mismatched)'."""
    for name, width in (("a", 3), ("b", 5)):
        graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
                             [h.make_tensor_value_info("x", T.FLOAT, ["batch", width])],
                             [h.make_tensor_value_info("y", T.FLOAT, ["batch", width])])
        onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), tmp_path / f"{name}.onnx")
    res = cli("diff", tmp_path / "a.onnx", tmp_path / "b.onnx")
    assert_one_line_error(res, 2, "input 'x'", "['batch', 3] vs ['batch', 5]")


def test_shape_sizes_the_shared_dims_of_other_inputs(cli, tmp_path: Path) -> None:
    """--shape ids:3,7 must size m [batch, sequence] too (it got the default [2, 4]: onnxruntime failed to broadcast,
    exit 2), and --save's summary records the shapes used."""
    import json

    nodes = [h.make_node("Cast", ["ids"], ["f"], to=T.FLOAT), h.make_node("Where", ["m", "f", "Z"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", T.INT64, ["batch", "sequence"]),
                                      h.make_tensor_value_info("m", T.BOOL, ["batch", "sequence"])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["batch", "sequence"])],
                         [nh.from_array(np.zeros(1, np.float32), "Z")])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "a.onnx")
    res = cli("diff", tmp_path / "a.onnx", tmp_path / "a.onnx", "--shape", "ids:3,7", "--save", tmp_path / "r.json")
    assert res.code == 0, res.err
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert {i["name"]: i["shape"] for i in summary["inputs"]} == {"ids": [3, 7], "m": [3, 7]}
    assert summary["passed"] is True and summary["outputs"][0]["total"] == 21


def test_output_shapes_that_differ_are_named(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    """Same names, outputs of other shapes (a Transpose more): exit 1 with a line that says the shapes differ."""
    w = rng.standard_normal((4, 3)).astype(np.float32)

    def save(path: Path, transpose: bool) -> Path:
        nodes = [onnx.helper.make_node("MatMul", ["x", "w"], ["h" if transpose else "y"])]
        if transpose:
            nodes.append(onnx.helper.make_node("Transpose", ["h"], ["y"], perm=[1, 0]))
        vi = onnx.helper.make_tensor_value_info
        g = onnx.helper.make_graph(nodes, "g", [vi("x", onnx.TensorProto.FLOAT, [2, 4])],
                                   [vi("y", onnx.TensorProto.FLOAT, ["r", "c"])], [nh.from_array(w, "w")])
        onnx.save(onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)]), path)
        return path

    a, b = save(tmp_path / "a.onnx", False), save(tmp_path / "b.onnx", True)
    res = cli("diff", a, b)
    assert_one_line_error(res, 1, "y (shapes differ: A [2, 3] vs B [3, 2])")


def test_engine_side_that_cannot_run_here_names_the_fix(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    """diff A.onnx ENGINE_DIR ('where TensorRT and a GPU exist'): a TensorRT-RTX plan was handed to full TensorRT
    (Polygraphy's default), and here the error was Polygraphy's 'set POLYGRAPHY_AUTOINSTALL_DEPS=1' (it would
    pip-install PyPI's tensorrt placeholder) followed by 'check the models run in onnxruntime'."""
    pytest.importorskip("tensorrt_rtx")
    from trtforge.build_engine.engine.backend import local_gpu_compute_capabilities

    if "8.6" in local_gpu_compute_capabilities():
        pytest.skip("an SM 8.6 GPU is here: the plan can run")
    vi = h.make_tensor_value_info
    w = nh.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g", [vi("x", T.FLOAT, ["batch", "sequence", 8])],
                     [vi("y", T.FLOAT, ["batch", "sequence", 4])], [w])
    model, eng = tmp_path / "m.onnx", tmp_path / "eng"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), model)
    assert cli("build", model, "--profile", "a10", "-o", eng, "--no-progress").code == 0
    env = {k: v for k, v in os.environ.items() if k != "POLYGRAPHY_USE_TENSORRT_RTX"}
    res = run_console(["diff", str(eng), str(model)], env=env)  # Polygraphy reads the variable at import
    assert_one_line_error(res, 2, str(eng), "built by tensorrt_rtx", "POLYGRAPHY_USE_TENSORRT_RTX=1")
    res = run_console(["diff", str(model), str(eng)], env={**env, "POLYGRAPHY_USE_TENSORRT_RTX": "1"})
    assert_one_line_error(res, 2, str(eng), "sm 8.6", str(eng / "model.onnx"))
    assert "AUTOINSTALL" not in res.err
