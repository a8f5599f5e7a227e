"""trtforge diff, round 4: inputs on which diff ran, or reported, something other than it was asked (real
Polygraphy Comparator runs over real onnxruntime sessions on tiny models built here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error, run_console

HIDDEN = 8


def _matmul_model(rng: np.random.Generator) -> onnx.ModelProto:
    """y = x @ w with x [batch, sequence, 8]: the last dim is static."""
    w = numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_contradicting_a_static_dim_is_refused(tmp_path: Path, rng: np.random.Generator, cli) -> None:
    """--shape x:2,3,9 on an input whose last dim is 8: Polygraphy's DataLoader dropped the shape and fed [1, 1, 8],
    while the table and R.summary.json reported inputs [2, 3, 9] and exit 0; now exit 2 naming the static dim."""
    a = tmp_path / "a.onnx"
    onnx.save(_matmul_model(rng), a)
    res = cli("diff", a, a, "--shape", "x:2,3,9", "--save", tmp_path / "r.json")
    assert_one_line_error(res, 2, "--shape", "'x'", "dimension 2", "fixed at 8")
    assert not list(tmp_path.glob("r*.json"))  # nothing saved: the comparison never ran

    # a shape that keeps the static dim is what runs: 2 * 3 * 8 output elements, and the summary says so
    res = cli("diff", a, a, "--shape", "x:2,3,8", "--save", tmp_path / "r.json")
    assert res.code == 0, res.err
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["inputs"][0]["shape"] == [2, 3, 8]
    assert summary["outputs"][0]["total"] == 2 * 3 * HIDDEN


def _cast_model(dtype: int) -> onnx.ModelProto:
    """y = float(i) for an input i [4] of ``dtype``: the output shows the value diff fed."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("i", dtype, [4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_value_the_input_dtype_cannot_hold_is_refused(tmp_path: Path, cli) -> None:
    """--value i=2.7 on an int64 input ran on 2 (the summary said 2.7), --value 70000 on a float16 input on inf,
    --value -3 on a uint8 input failed as 'running ... failed' naming onnxruntime; now each exits 2 naming the input's
    dtype and what it holds. Values it holds still run as given."""
    for dtype, value, needle in ((TensorProto.INT64, "2.7", "int64"), (TensorProto.UINT8, "-3", "from 0 to 255"),
                                 (TensorProto.FLOAT16, "70000", "65504"), (TensorProto.BOOL, "0.5", "0 or 1")):
        path = tmp_path / f"m{dtype}.onnx"
        onnx.save(_cast_model(dtype), path)
        assert_one_line_error(cli("diff", path, path, "--value", f"i={value}"), 2, "--value", "'i'", needle)
    from polygraphy.comparator import RunResults

    for dtype, value in ((TensorProto.INT64, -3.0), (TensorProto.UINT8, 255.0), (TensorProto.FLOAT16, -65504.0),
                         (TensorProto.BOOL, 1.0)):
        path, save = tmp_path / f"m{dtype}.onnx", tmp_path / f"r{dtype}.json"
        res = cli("diff", path, path, "--value", f"i={value:g}", "--save", save)
        assert res.code == 0, res.err
        fed = RunResults.load(str(save))[0][1][0]["y"]
        np.testing.assert_array_equal(np.asarray(fed), np.full(4, value, np.float32))


def _divide_model(divisor: float) -> onnx.ModelProto:
    """y = x / divisor; 0 gives +-inf on every element."""
    c = helper.make_node("Constant", [], ["d"], value=numpy_helper.from_array(np.array(divisor, np.float32)))
    graph = helper.make_graph(
        [c, helper.make_node("Div", ["x", "d"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inf_outputs_leave_one_error_line(tmp_path: Path) -> None:
    """Infinite outputs made Polygraphy's statistics raise NumPy RuntimeWarnings ('invalid value encountered in
    subtract'): a mismatch printed 5-7 stderr lines around its one 'error:' line, a match 6 lines; now the mismatch
    has exactly the error line and the match a quiet stderr (a real process: pytest would capture warnings)."""
    inf, fin = tmp_path / "inf.onnx", tmp_path / "fin.onnx"
    onnx.save(_divide_model(0.0), inf)
    onnx.save(_divide_model(1.0), fin)
    for a, b in ((inf, fin), (fin, inf)):
        assert_one_line_error(run_console(["diff", str(a), str(b)]), 1, "y (max abs inf, 3/3 mismatched)")
    res = run_console(["diff", str(inf), str(inf)])
    assert (res.code, res.err) == (0, ""), res.err


def _two_output_model(rng: np.random.Generator) -> onnx.ModelProto:
    """The MatMul model plus a second output z = -y."""
    model = _matmul_model(rng)
    model.graph.node.append(helper.make_node("Neg", ["y"], ["z"]))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "sequence", HIDDEN]))
    return model


def test_engine_folder_against_a_model_with_other_outputs(tmp_path: Path, rng: np.random.Generator, cli,
                                                          monkeypatch) -> None:
    """An engine folder on one side skipped the name check two models get, and only the outputs both sides produced
    were compared: on a GPU, an engine of y against a model of y and z passed on y alone. Now the manifest's names
    are checked first (exit 2 naming both sides' outputs, before any runner is made), and an output only one side
    produces is a failed row."""
    from trtforge.build_engine.core.errors import CheckFailed
    from trtforge.build_engine.verify.diff import DiffResult, _missing, check

    src, other = tmp_path / "src.onnx", tmp_path / "other.onnx"
    onnx.save(_matmul_model(rng), src)
    onnx.save(_two_output_model(rng), other)
    assert cli("build", src, "--profile", "a100", "-o", tmp_path / "e", "--no-progress").code == 0
    monkeypatch.setenv("POLYGRAPHY_USE_TENSORRT_RTX", "1")
    for a, b in ((tmp_path / "e", other), (other, tmp_path / "e")):
        assert_one_line_error(cli("diff", a, b), 2, "differ in inputs/outputs", "outputs ['y']", "['y', 'z']")
    rows = _missing({"y": 0, "z": 0}, {"y": 0})
    assert [(r.name, r.passed, r.shapes) for r in rows] == [("z", False, "only A has it")]
    with pytest.raises(CheckFailed, match=r"z \(only A has it\)"):  # exit 1
        check(DiffResult("A", "B", 0.0, 0.0, 0, (), rows))


def test_polygraphy_never_imports_torch(tmp_path: Path, rng: np.random.Generator) -> None:
    """Polygraphy asked of every output whether it was a torch tensor, importing torch (~2 s) inside a bare
    ``except:``: a Ctrl-C or SIGTERM landing there was swallowed and the next probe re-imported a half-initialised
    torch, so pybind11 aborted (exit 134, or SIGSEGV) instead of 130/143. Now torch is kept out of the run: a stand-in
    ``torch`` package on the path (it leaves a marker when imported) is never imported by diff or --save."""
    import os

    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    marker = tmp_path / "torch-imported"
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('stand-in torch')\n")
    a = tmp_path / "a.onnx"
    onnx.save(_matmul_model(rng), a)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    res = run_console(["diff", str(a), str(a), "--save", str(tmp_path / "r.json")], env=env)
    assert res.code == 0, res.err
    assert not marker.exists(), "diff imported torch"
    assert (tmp_path / "r.summary.json").is_file()


def test_inputs_no_numpy_loader_can_feed_are_one_clear_error(tmp_path: Path, cli) -> None:
    """A bfloat16 or float8 graph input: Polygraphy's data loader failed ('use a custom data loader') under a hint to
    check onnxruntime and pass --shape, and for float8 it first printed two '[W]' lines of its own; now one error
    line naming the input, its dtype and what to compare instead."""
    for dtype, name in ((TensorProto.BFLOAT16, "bfloat16"), (TensorProto.FLOAT8E4M3FN, "float8_e4m3fn")):
        path = tmp_path / f"{name}.onnx"
        model = _cast_model(dtype)
        model.opset_import[0].version = 19
        onnx.save(model, path)
        assert_one_line_error(cli("diff", path, path), 2, f"input 'i' is {name}", "float32")


def _reshape_model(shape: list[int]) -> onnx.ModelProto:
    """y = Reshape(x [2], shape): the same values, another output shape."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
        [numpy_helper.from_array(np.array(shape, np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_quantized_preset_names_an_output_shape_mismatch(tmp_path: Path, cli) -> None:
    """Outputs of other shapes under --precision int8 read 'y (relative error inf, top-1 n/a)', a number with no
    cause; now the same words as the element-wise presets: 'y (shapes differ: A [2, 1] vs B [1, 2])', exit 1."""
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(_reshape_model([2, 1]), a)
    onnx.save(_reshape_model([1, 2]), b)
    for preset in ("int8", "fp32"):
        assert_one_line_error(cli("diff", a, b, "--precision", preset), 1,
                              "y (shapes differ: A [2, 1] vs B [1, 2])")
