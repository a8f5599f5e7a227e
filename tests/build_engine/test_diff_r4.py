"""trtforge diff, round 4: inputs on which diff ran, or reported, something other than it was asked (real
Polygraphy Comparator runs over real onnxruntime sessions on tiny models built here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error

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
