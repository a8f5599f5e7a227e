"""``core.staging``: whose leftovers a sweep removes, swap recovery, the exchange commit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trtforge.build_engine.core import staging
from trtforge.build_engine.core.fsutil import atomic_dir, write_text


def _sweep_in_other_process(root: Path) -> list[str]:
    code = ("import json,sys; from trtforge.build_engine.core import staging; "
            "print(json.dumps(staging.sweep(__import__('pathlib').Path(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def test_sweep_keeps_live_and_foreign_folders_removes_dead_ones(tmp_path: Path) -> None:
    base = tmp_path / staging.STAGING
    with staging.staging_dir(tmp_path, "live.onnx") as live:  # held by this (live) process
        foreign = base / "0123456789abcdef0123456789abcdef"  # build-matrix's cell folders: not ours to judge
        foreign.mkdir()
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
        no_lock = base / f"out.onnx.{dead}.abcd1234"  # killed before it could create its lock
        no_lock.mkdir()
        killed = base / "pool.st.1.abcd5678"  # a lock file nobody holds: its process is gone
        killed.mkdir()
        (killed / ".lock").touch()
        done = _sweep_in_other_process(tmp_path)
        assert live.is_dir() and foreign.is_dir()
        assert not no_lock.exists() and not killed.exists()
        assert len(done) == 2 and all("interrupted run" in d for d in done)
    assert not live.exists() and foreign.is_dir()


def test_recover_completes_or_rolls_back(tmp_path: Path) -> None:
    for parts, want in ((("new", "old"), "new"), (("old",), "old")):
        dest = tmp_path / f"eng_{want}"
        entry = tmp_path / staging.STAGING / f"{dest.name}.1.abcdefgh"
        for p in parts:
            (entry / p).mkdir(parents=True)
            (entry / p / "which").write_text(p)
        (entry / staging.RECORD).write_text(json.dumps({"dest": str(dest)}))
        (entry / ".lock").touch()
        staging.sweep(tmp_path)
        assert (dest / "which").read_text() == want
    assert not (tmp_path / staging.STAGING).exists()


def test_exchange_and_fallback_replace_folder_in_place(tmp_path: Path, monkeypatch) -> None:
    dest = tmp_path / "out"
    for i, fallback in enumerate((False, True, False)):
        if fallback:
            monkeypatch.setenv(staging.NO_EXCHANGE_ENV, "1")
        else:
            monkeypatch.delenv(staging.NO_EXCHANGE_ENV, raising=False)
        with atomic_dir(dest, force=True) as tmp:
            (tmp / "n").write_text(str(i))
        assert (dest / "n").read_text() == str(i)
        assert sorted(os.listdir(tmp_path)) == ["out"]
    write_text(tmp_path / "f.txt", "x")
    assert sorted(os.listdir(tmp_path)) == ["f.txt", "out"]
