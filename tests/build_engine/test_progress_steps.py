"""Steps of a command on stderr (issue 18.7): shown with --progress (or on a terminal), never on stdout, and the
printed duration is the whole command's."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest

from trtforge.build_engine.core import steps
from trtforge.examples.llama import make_llama


@pytest.fixture
def model(tmp_path: Path) -> Path:
    p = tmp_path / "m.onnx"
    onnx.save(make_llama(seed=1), p)
    return p


def test_progress_lists_each_step_on_stderr_only(cli, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "SHOW_AFTER", 0.0)  # every finished step leaves its line, however short
    res = cli("precision", model, "-o", model.with_name("p.onnx"), "--to", "fp16", "--progress")
    assert res.code == 0, res.err
    for label in ("load m.onnx", "convert", "save p.onnx"):
        assert re.search(rf"^{re.escape(label)}\s+\d+\.\d s$", res.err, re.M), (label, res.err)
    assert "load m.onnx" not in res.out and not re.search(r"^convert", res.out, re.M)
    total = float(re.search(r"; (\d+\.\d+) s in all", res.out).group(1))
    shown = sum(float(x) for x in re.findall(r"^\S.*?\s+(\d+\.\d) s$", res.err, re.M))
    assert total >= shown - 0.2  # the printed time covers every step, load and save included


def test_no_progress_without_the_flag_off_a_terminal(cli, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "SHOW_AFTER", 0.0)
    res = cli("fold", model, "-o", model.with_name("f.onnx"))
    assert res.code == 0 and res.err == ""
    assert "(load, fold and save" in res.out
