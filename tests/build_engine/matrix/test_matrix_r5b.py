"""Round-5 QA regressions for build-matrix, second batch (no engine is built: dry runs only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtforge.build_engine.cli import main

_A = '[[model]]\npath = "m.onnx"\n'


def _tiny_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_dry_run_counts_add_up_to_the_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # old: counts held built/cached/failed/refused only, all 0 for two planned cells beside one refused ({..., 1})
    _tiny_model(tmp_path / "m.onnx")
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a10", "l40s", "no-such-gpu"]\n' + _A)
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1  # the unknown profile's cell is refused
    assert report["counts"] == {"built": 0, "cached": 0, "failed": 0, "refused": 1, "planned": 2}
    assert sum(report["counts"].values()) == len(report["cells"])
    assert not (tmp_path / "out").exists()
