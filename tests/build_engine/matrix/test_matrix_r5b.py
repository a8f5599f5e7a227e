"""Round-5 QA regressions for build-matrix, second batch (no engine is built: dry runs only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtforge.build_engine.cli import main
from trtforge_testing import relu_model_file, renamed_profile_file

_A = '[[model]]\npath = "m.onnx"\n'


def test_dry_run_counts_add_up_to_the_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # old: counts held built/cached/failed/refused only, all 0 for two planned cells beside one refused ({..., 1})
    relu_model_file(tmp_path / "m.onnx")
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a10", "l40s", "no-such-gpu"]\n' + _A)
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1  # the unknown profile's cell is refused
    assert report["counts"] == {"built": 0, "cached": 0, "failed": 0, "refused": 1, "planned": 2}
    assert sum(report["counts"].values()) == len(report["cells"])
    assert not (tmp_path / "out").exists()


def test_bare_profile_name_is_not_read_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # old: profiles = ["mygpu"], no file mygpu beside the matrix but one in the working directory: that file was read
    # (cell planned as 'cwdgpu', its folder name unchecked, the file not guarded as an input); a matrix's refs are
    # relative to the matrix file, so the name is now an unknown profile and its cell is refused
    relu_model_file(tmp_path / "m.onnx")
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["mygpu"]\n' + _A)
    renamed_profile_file(tmp_path / "cwd" / "mygpu", "cwdgpu")
    monkeypatch.chdir(tmp_path / "cwd")
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run", "--json"])
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert code == 1
    assert (cell["profile"], cell["status"]) == ("mygpu", "refused")
    assert "unknown profile 'mygpu'" in cell["reason"]


def test_bare_profile_name_beside_the_matrix_wins_over_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    relu_model_file(tmp_path / "m.onnx")
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["mygpu"]\n' + _A)
    renamed_profile_file(tmp_path / "mygpu", "matrixgpu")
    renamed_profile_file(tmp_path / "cwd" / "mygpu", "cwdgpu")
    monkeypatch.chdir(tmp_path / "cwd")
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run", "--json"])
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert code == 0
    assert (cell["profile"], cell["status"]) == ("matrixgpu", "planned")


def test_cli_bare_profile_name_is_a_working_directory_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # the CLI's relative paths are the working directory's: --profile mygpu reads ./mygpu when it is no built-in
    renamed_profile_file(tmp_path / "mygpu", "cwdgpu")
    monkeypatch.chdir(tmp_path)
    code = main(["profiles", "mygpu", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads(out)["name"] == "cwdgpu"
