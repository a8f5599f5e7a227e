"""build-matrix cache (held-out QA): a run waits while another run writes the same OUTROOT (it used to delete the
other run's staged builds, failing its cells), and a damaged cache entry is rebuilt, never served."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path

import pytest

from trtforge.build_engine.matrix.driver import LOCK_FILE, run_matrix
from trtforge.build_engine.matrix.spec import load_matrix
from trtforge.examples.make_example import write_example

pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds the engines (pip install 'trtforge[rtx]')")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mxqa")
    write_example(root / "m", seed=int.from_bytes(os.urandom(2), "little"))
    path = root / "mx.toml"
    path.write_text('[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "m/llama_fp32.onnx"\nname = "llama"\n')
    return path


def test_second_run_waits_for_the_lock_then_finds_the_cell_cached(matrix: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another run is writing OUTROOT
    reports: list[object] = []
    worker = threading.Thread(target=lambda: reports.append(run_matrix(load_matrix(matrix), out)))
    worker.start()
    time.sleep(1.0)
    assert worker.is_alive() and not (out / "matrix.json").exists() and not (out / "llama").exists()
    os.close(fd)
    worker.join(120)
    assert not worker.is_alive()
    (report,) = reports
    assert [c.status for c in report.cells] == ["built"]  # type: ignore[attr-defined]
    again = run_matrix(load_matrix(matrix), out)
    assert [c.status for c in again.cells] == ["cached"]


def test_damaged_entry_is_rebuilt(matrix: Path, tmp_path: Path) -> None:
    import hashlib

    out = tmp_path / "out"
    assert [c.status for c in run_matrix(load_matrix(matrix), out).cells] == ["built"]
    cell = out / "llama" / "a100"
    plan = cell / "model.plan"
    for damage in ("truncate-plan", "flip-plan-byte", "cell-json"):
        good = plan.read_bytes()
        if damage == "truncate-plan":
            plan.write_bytes(good[: len(good) // 2])
        elif damage == "flip-plan-byte":
            at = len(good) // 3
            plan.write_bytes(good[:at] + bytes([good[at] ^ 1]) + good[at + 1:])
        else:
            (cell / "cell.json").write_text((cell / "cell.json").read_text()[:40])
        assert [c.status for c in run_matrix(load_matrix(matrix), out, dry_run=True).cells] == ["planned"], damage
        assert [c.status for c in run_matrix(load_matrix(matrix), out).cells] == ["built"], damage
        manifest = json.loads((cell / "manifest.json").read_text())
        assert hashlib.sha256(plan.read_bytes()).hexdigest() == manifest["plan_sha256"]


def test_tampered_cell_folder_is_rebuilt(matrix: Path, tmp_path: Path) -> None:
    """A plan matching its own manifest was taken as cached: another cell's engine and manifest copied in (an
    SM 8.0 engine served as the a10 one), an edited manifest, or a removed model.onnx were served as cached."""
    import shutil

    two = matrix.with_name("mx-two.toml")
    two.write_text('[matrix]\nprofiles = ["a10", "a100"]\n[[model]]\npath = "m/llama_fp32.onnx"\nname = "llama"\n')
    out = tmp_path / "out"
    assert [c.status for c in run_matrix(load_matrix(two), out).cells] == ["built", "built"]
    a10, a100 = out / "llama" / "a10", out / "llama" / "a100"
    pristine = tmp_path / "a10-pristine"
    shutil.copytree(a10, pristine)

    def swap_engine() -> None:
        for name in ("model.plan", "manifest.json"):
            shutil.copyfile(a100 / name, a10 / name)

    def edit_manifest() -> None:
        data = json.loads((a10 / "manifest.json").read_text())
        data["precision"] = "fp32"
        (a10 / "manifest.json").write_text(json.dumps(data))

    for damage in (swap_engine, edit_manifest, lambda: (a10 / "model.onnx").unlink(),
                   lambda: (a10 / "stray.bin").write_bytes(b"x")):
        shutil.rmtree(a10)
        shutil.copytree(pristine, a10)
        damage()
        assert [c.status for c in run_matrix(load_matrix(two), out, dry_run=True).cells] == ["planned", "cached"]
    report = run_matrix(load_matrix(two), out)
    assert [c.status for c in report.cells] == ["built", "cached"]
    assert json.loads((a10 / "manifest.json").read_text())["profile"] == "a10"
    assert sorted(p.name for p in a10.iterdir()) == ["cell.json", "manifest.json", "model.onnx", "model.plan"]
    assert [c.status for c in run_matrix(load_matrix(two), out, dry_run=True).cells] == ["cached", "cached"]
