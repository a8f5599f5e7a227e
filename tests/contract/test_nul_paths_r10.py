"""A NUL character in a path read from an input file (``os`` calls raise ValueError 'embedded null byte'): an ONNX
model's external-data location is named (every command exited 3), and any other such path is exit 2 with one line
(``run_command``'s last resort). build-matrix's own fields: tests/build_engine/matrix/test_matrix_r10.py."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.cli._common import run_command
from trtforge_testing import CliResult, assert_one_line_error


def _nul_model(root: Path, rng: np.random.Generator) -> Path:
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), root / "m.onnx",
              save_as_external_data=True, location="m.data", size_threshold=0)
    model = onnx.load(root / "m.onnx", load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "m\0.data"
    (root / "nul.onnx").write_bytes(model.SerializeToString())
    return root / "nul.onnx"


@pytest.mark.parametrize("argv", [("fold", "-o", "o.onnx"), ("precision", "--to", "fp16", "-o", "o.onnx"),
                                  ("quantize", "--mode", "int8", "-o", "o.onnx"), ("diff", "m.onnx")])
def test_external_data_location_with_nul_is_named(tmp_path: Path, rng: np.random.Generator, cli,
                                                  monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]) -> None:
    src = _nul_model(tmp_path, rng)
    monkeypatch.chdir(tmp_path)
    res = cli(argv[0], src, *argv[1:])
    assert_one_line_error(res, 2, "nul.onnx", "'w'", "NUL character")
    assert not (tmp_path / "o.onnx").exists()


def test_any_other_nul_path_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    def handler(_: object) -> int:
        os.stat("a\0b")  # what a path read from some file does in an os call
        return 0

    code = run_command(argparse.ArgumentParser(prog="t"), handler, [])
    cap = capsys.readouterr()
    assert_one_line_error(CliResult(code, cap.out, cap.err), 2, "NUL character")
