"""The CLI error contract (build_engine/cli/_common.py)
for every command that reads an ONNX model: a missing file, a file that
is not ONNX and a truncated ONNX each give exit 2, one 'error:' line naming the file, no traceback, and nothing
written at the output path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error, seeded_rng


def _tiny_model(path: Path) -> Path:
    rng = seeded_rng("test_cli_contract._tiny_model")
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _commands(src: Path, out: Path) -> dict[str, list[str]]:
    return {
        "fold": ["fold", str(src), "-o", str(out)],
        "precision": ["precision", str(src), "-o", str(out), "--to", "fp16"],
        "build": ["build", str(src), "--profile", "a100", "-o", str(out)],
        "lora-inject": ["lora", "inject", str(src), "-o", str(out), "--targets", "q_proj", "--max-rank", "8",
                        "--slots", "2"],
        "lora-decompose": ["lora", "decompose", str(src), "-o", str(out)],
        "diff": ["diff", str(src), str(src)],
    }


@pytest.fixture(params=["missing", "not-onnx", "truncated", "empty"])
def bad_input(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    kind = request.param
    path = tmp_path / f"{kind}.onnx"
    if kind == "not-onnx":
        path.write_text("this is a README, not a model\n" * 20)
    elif kind == "truncated":
        good = _tiny_model(tmp_path / "good.onnx").read_bytes()
        path.write_bytes(good[: len(good) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    return path


@pytest.mark.parametrize("command", list(_commands(Path("a"), Path("b"))))
def test_bad_onnx_input_is_exit_2_one_line_nothing_written(cli, bad_input: Path, tmp_path: Path,
                                                            command: str) -> None:
    out = tmp_path / "out" / "result"
    out.parent.mkdir()
    res = cli(*_commands(bad_input, out)[command])
    assert_one_line_error(res, 2, bad_input.name)
    assert list(out.parent.iterdir()) == [], "an output was left behind"
