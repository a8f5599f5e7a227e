"""build-matrix on Ray under failure (held-out QA): a SIGTERM to the driver exits 143 like every command (ray.init
replaced the handler: exit 1 and a C++ stack dump), and the driver does not keep every cell's engine bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtforge.build_engine.matrix.worker import KILL_ONCE_ENV
from trtforge.examples.make_example import write_example

pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds the engines (pip install 'trtforge[rtx]')")
pytest.importorskip("ray", reason="the Ray executor needs ray (pip install 'trtforge[cluster]')")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mxray")
    write_example(root / "m", seed=11)
    path = root / "mx.toml"
    path.write_text('[matrix]\nprofiles = ["a10", "a100"]\n[[model]]\npath = "m/llama_fp32.onnx"\nname = "llama"\n')
    return path


def test_sigterm_while_ray_builds_exits_143(matrix: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"  # a cell's worker writes its marker as its build starts (then dies once: retried)
    marks.mkdir()
    out = tmp_path / "out"
    exe = Path(sys.executable).with_name("trtforge")
    proc = subprocess.Popen([str(exe), "build-matrix", str(matrix), "-o", str(out), "--executor", "ray", "--jobs", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, KILL_ONCE_ENV: str(marks)})
    try:
        for _ in range(1200):  # the driver waits in ray.wait once a cell runs
            if any(marks.iterdir()) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert any(marks.iterdir()), proc.communicate(timeout=60)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert "error: interrupted by SIGTERM" in err.splitlines()[-1] and "SIGTERM received" not in err, err
    assert not (out / "llama").exists() and not (out / ".trtforge-matrix-staging").exists()


def test_ray_driver_keeps_no_engine_bytes_of_finished_cells(matrix: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a shared filesystem each cell's files come back as bytes: the driver kept them (in the executor's
    results) until the run ended, so its memory grew with the matrix; each cell's bytes go once committed. A cell
    whose worker was killed and retried by Ray says 2 attempts (it said 1). The --address check (a gRPC answer on
    the port) accepts a real head's GCS address."""
    import gc

    import ray

    from trtforge.build_engine.matrix.cells import node_resources
    from trtforge.build_engine.matrix.driver import run_matrix
    from trtforge.build_engine.matrix.executors import check_address
    from trtforge.build_engine.matrix.spec import load_matrix
    from trtforge.build_engine.matrix.worker import CellResult

    held: list[int] = []

    def count(st: object) -> None:
        if getattr(st, "status", "") == "built":
            held.append(sum(1 for o in gc.get_objects() if isinstance(o, CellResult) and o.files))

    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv(KILL_ONCE_ENV, str(marks))  # each cell's first attempt SIGKILLs its Ray worker mid-build
    ctx = ray.init(num_cpus=2, resources=node_resources(), include_dashboard=False, log_to_driver=False,
                   configure_logging=False)
    try:
        gcs = ctx.address_info["gcs_address"]
        check_address(gcs)
        report = run_matrix(load_matrix(matrix), tmp_path / "out", executor="ray", address=gcs, jobs=2,
                            progress=count)
    finally:
        ray.shutdown()
    assert [(c.status, c.attempts) for c in report.cells] == [("built", 2), ("built", 2)]
    assert held == [0, 0]
    assert all((tmp_path / "out" / "llama" / p / "model.plan").stat().st_size > 0 for p in ("a10", "a100"))
