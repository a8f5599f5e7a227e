"""build-matrix cells that fail deterministically (held-out QA): a model TensorRT-RTX cannot parse fails only its
cell, and the reason names the model the matrix gave (it named the worker's deleted temporary
/tmp/trtforge-cell-*/pipeline.onnx); real TensorRT-RTX builds of one-node models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.cli import main

pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds the engines (pip install 'trtforge[rtx]')")


def _models(root: Path, rng: np.random.Generator) -> None:
    """``good.onnx`` (one MatMul) and ``custom.onnx`` (an op of a domain no TensorRT knows: its parser refuses)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    good = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    onnx.save(helper.make_model(good, opset_imports=[helper.make_opsetid("", 17)]), root / "good.onnx")
    custom = helper.make_graph([helper.make_node("FooBar", ["x", "w"], ["y"], domain="com.example")], "g", [x], [y],
                               [w])
    onnx.save(helper.make_model(custom, opset_imports=[helper.make_opsetid("", 17),
                                                       helper.make_opsetid("com.example", 1)]), root / "custom.onnx")


def test_unparseable_model_fails_its_cell_naming_the_model(tmp_path: Path, rng: np.random.Generator,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import json

    _models(tmp_path, rng)
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "custom.onnx"\n'
                                      '[[model]]\npath = "good.onnx"\n')
    out = tmp_path / "out"
    assert main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(out), "--jobs", "1"]) == 1
    cells = {c["model"]: c for c in json.loads((out / "matrix.json").read_text())["cells"]}
    assert cells["good"]["status"] == "built" and (out / "good" / "a100" / "model.plan").is_file()
    reason = cells["custom"]["reason"]
    assert cells["custom"]["status"] == "failed" and "\n" not in reason
    assert reason.startswith(str(tmp_path / "custom.onnx")) and "FooBar" in reason, reason
    assert "trtforge-cell-" not in reason and "trtforge-cell-" not in capsys.readouterr().err
    assert not (out / "custom").exists()


def test_ctrl_c_while_a_cell_is_published_keeps_the_cell(tmp_path: Path, rng: np.random.Generator,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Where renameat2's exchange is missing, publishing a rebuilt cell moves the old folder aside, then renames the
    new one in; a Ctrl-C between the two removed both (the staging folder holding them was deleted on the way out):
    the cell folder was gone. Now the signal waits for the commit, as every other commit does."""
    import json

    _models(tmp_path, rng)
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "good.onnx"\n')
    out = tmp_path / "out"
    assert main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(out), "--jobs", "1"]) == 0
    old_key = json.loads((out / "good" / "a100" / "cell.json").read_text())["key"]
    _models(tmp_path, rng)  # other weights: the cell is rebuilt over its old folder
    monkeypatch.setenv("TRTFORGE_TEST_NO_EXCHANGE", "1")
    monkeypatch.setenv("TRTFORGE_TEST_KILL_AT", "dir:between-renames:SIGINT")
    assert main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(out), "--jobs", "1"]) == 130
    cell = json.loads((out / "good" / "a100" / "cell.json").read_text())  # all-new (or all-old), never none
    assert cell["key"] != old_key and (out / "good" / "a100" / "model.plan").stat().st_size > 0
    assert sorted(p.name for p in out.iterdir()) == [".trtforge-matrix.lock", "good", "matrix.json"]
