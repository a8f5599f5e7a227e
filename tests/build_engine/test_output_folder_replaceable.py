"""An output folder replaced as a whole (``build -o``, ``triton --repo R --name N``) must be one a rename can
replace: ``.`` / ``..`` and a mount point were refused by the kernel (EBUSY) after the whole build, exit 3
'internal error', with or without ``--force``. Now exit 2 up front, naming the fix, and nothing is written."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtforge_testing import assert_one_line_error, relu_model_file


def _model(path: Path) -> Path:
    relu_model_file(path)
    return path


@contextlib.contextmanager
def _mount_point(path: Path) -> Iterator[Path]:
    path.mkdir()
    if not shutil.which("mount") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("this machine does not let a test mount a tmpfs")
    try:
        (path / "keep.txt").write_text("kept\n")
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


@pytest.mark.parametrize("out", [".", ".."])
def test_build_into_dot_is_exit_2(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str) -> None:
    model = _model(tmp_path / "m.onnx")
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("kept\n")
    monkeypatch.chdir(work)
    res = cli("build", model, "--profile", "a10", "-o", out, "--force", "--no-progress")
    assert_one_line_error(res, 2, f"-o {out}", "'.' or '..'", "-o engine")
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in work.parent.iterdir()) == ["b"]


def test_build_onto_a_mount_point_is_exit_2(cli, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    model = _model(tmp_path / "m.onnx")
    with _mount_point(tmp_path / "mnt") as mnt:
        res = cli("build", model, "--profile", "a10", "-o", mnt, "--force", "--no-progress")
        assert_one_line_error(res, 2, str(mnt), "mount point", str(mnt / "engine"))
        assert sorted(p.name for p in mnt.iterdir()) == ["keep.txt"]
        # A folder inside it is built as usual.
        assert cli("build", model, "--profile", "a10", "-o", mnt / "engine", "--no-progress").code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "mnt"]


def test_triton_entry_onto_a_mount_point_is_exit_2(cli, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    engine = tmp_path / "engine"
    assert cli("build", _model(tmp_path / "m.onnx"), "--profile", "a10", "-o", engine, "--no-progress").code == 0
    repo = tmp_path / "repo"
    repo.mkdir()
    with _mount_point(repo / "m") as mnt:
        res = cli("triton", engine, "--repo", repo, "--name", "m", "--force", "--no-warmup")
        assert_one_line_error(res, 2, "mount point")
        assert sorted(p.name for p in mnt.iterdir()) == ["keep.txt"]
    res = cli("triton", engine, "--repo", repo, "--name", ".", "--force", "--no-warmup")
    assert res.code == 2 and "Traceback" not in res.err, res.err
