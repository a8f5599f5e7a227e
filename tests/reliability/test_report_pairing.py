"""A model and its ``--report`` are two files renamed one after the other; a ``kill -9`` between the two renames
leaves the new model beside the old report. The report records the sha256 of the model file it describes
(``output_sha256``), so such a pair is told apart from a matching one (``core.pairing.report_matches``)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.core.pairing import report_matches
from trtforge_testing import run_console, seeded_rng


def _model(path: Path, label: str, external: bool) -> None:
    w = numpy_helper.from_array(seeded_rng(label).standard_normal((16, 8)).astype("float32"), "w")
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("MatMul", ["xi", "w"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    if external:
        onnx.save(model, path, save_as_external_data=True, location=f"{path.name}.data", size_threshold=0)
    else:
        onnx.save(model, path)


def _run(argv: list[str], kill_at: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTFORGE_TEST_")}
    if kill_at:
        env["TRTFORGE_TEST_KILL_AT"] = kill_at
    return run_console(argv, env=env, timeout=300).code


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("external", [False, True])
@pytest.mark.parametrize("command", ["fold", "precision"])
def test_report_names_the_model_it_describes(tmp_path: Path, command: str, external: bool) -> None:
    old, new = tmp_path / "old.onnx", tmp_path / "new.onnx"
    _model(old, "pair-old", external)
    _model(new, "pair-new", external)
    out, rep = tmp_path / "out" / "m.onnx", tmp_path / "out" / "m.json"
    out.parent.mkdir()
    extra = ["--to", "fp16"] if command == "precision" else []

    def write(src: Path, kill_at: str | None = None) -> int:
        return _run([command, str(src), "-o", str(out), "--report", str(rep), *extra], kill_at)

    assert write(old) == 0
    report = json.loads(rep.read_text())
    assert report["output_sha256"] == _sha(out) and report["output_bytes"] == out.stat().st_size
    assert report_matches(rep, out)
    old_sha = _sha(out)
    # Killed after the model's rename, before the report's: new model, old report; the pair says so.
    assert write(new, "model:committed") == -9
    assert _sha(out) != old_sha
    assert json.loads(rep.read_text())["output_sha256"] == old_sha
    assert not report_matches(rep, out)
    # Killed before the model's rename: both old, and they match.
    assert write(old) == 0
    assert write(new, "model:staged") == -9
    assert report_matches(rep, out) and json.loads(rep.read_text())["output_sha256"] == _sha(out)
    # A complete run pairs them again.
    assert write(new) == 0
    assert report_matches(rep, out) and _sha(out) != old_sha
