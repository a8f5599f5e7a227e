"""More held-out checks of trtforge quantize (models built here): the command's stdout is its own summary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

K, N, ROWS = 64, 48, 5


@pytest.mark.parametrize("calibrator", ["percentile", "entropy"])
def test_stdout_is_the_summary_with_onnxruntime_calibrators(calibrator: str, cli, tmp_path: Path,
                                                           rng: np.random.Generator) -> None:
    """onnxruntime.quantization's calibrators print progress ("Collecting tensor data and making histogram ...",
    "Number of tensors : 1") on stdout, ahead of the command's summary line."""
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                               helper.make_node("Relu", ["h"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, N])],
                              [numpy_helper.from_array(w, "w")])
    src, out = tmp_path / "src.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), src)
    res = cli("quantize", src, "-o", out, "--mode", "int8", "--calibrator", calibrator, "--calib-size", "3")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{out}: int8, 1 projections quantized, 0 kept in float"), lines
