"""build-matrix on a real Ray cluster whose head dies mid-run: the driver reports the cells that finished (table and
matrix.json), names every lost cell with the reason, and exits 1 as for any failed cell. Before, Ray's core worker
ended the driver from C++ once it had waited 60 s for the head: exit 1, no table, no matrix.json."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import seeded_rng

pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds the engines (pip install 'trtforge[rtx]')")
pytest.importorskip("ray", reason="the Ray executor needs ray (pip install 'trtforge[cluster]')")

BIN = Path(sys.executable).parent


def _model(path: Path, label: str) -> None:
    w = numpy_helper.from_array(seeded_rng(label).standard_normal((16, 8)).astype("float32"), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pids_under(folder: str, names: tuple[str, ...] = ()) -> list[int]:
    """Processes of the cluster this test started (their command line names its private Ray folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if folder in cmd and (not names or any(n in cmd.split(" ")[0] for n in names)):
                found.append(int(entry.name))
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_head_death_reports_the_finished_cells(tmp_path: Path) -> None:
    ray_dir = tempfile.mkdtemp(prefix="trtforge-rl", dir="/tmp")  # a socket path must stay under 108 bytes
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRTFORGE_TEST_", "RAY_"))}
    # A private cluster without token authentication (a token another Ray user left in ~/.ray would turn it on).
    env.update(RAY_TMPDIR=ray_dir, RAY_AUTH_MODE="disabled", TRTFORGE_RAY_HEAD_GRACE_S="2")
    lines = ["[matrix]", 'profiles = ["a10", "a100"]']
    for i in range(3):
        _model(tmp_path / f"m{i}.onnx", f"ray-lost-{i}")
        lines += ["[[model]]", f'path = "m{i}.onnx"', f'name = "m{i}"']
    (tmp_path / "mx.toml").write_text("\n".join(lines) + "\n")
    try:
        resources = subprocess.run([str(BIN / "trtforge"), "build-matrix", "--node-resources"], env=env, check=True,
                                   capture_output=True, text=True, timeout=60).stdout.strip()
        subprocess.run([str(BIN / "ray"), "start", "--head", f"--port={port}", "--num-cpus=1", resources,
                        "--include-dashboard=false", "--disable-usage-stats"],
                       env=env, check=True, capture_output=True, timeout=120)
        proc = subprocess.Popen([str(BIN / "trtforge"), "build-matrix", "mx.toml", "-o", "out", "--executor", "ray",
                                 "--address", f"127.0.0.1:{port}"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        first = proc.stderr.readline()  # '[built] m0/a10 ...' (one CPU: the cells build one at a time)
        assert first.startswith("[built]"), first + proc.stderr.read()
        _kill(_pids_under(ray_dir, ("gcs_server", "raylet")))  # the head node dies
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=120)
        waited = time.monotonic() - t0
    finally:
        _kill(_pids_under(ray_dir))
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert proc.returncode == 1, (proc.returncode, err)
    assert "Traceback" not in err and waited < 50, (waited, err)  # Ray's own limit ended the driver at 60 s
    report = json.loads((tmp_path / "out" / "matrix.json").read_text())
    status = {(c["model"], c["profile"]): (c["status"], c["reason"]) for c in report["cells"]}
    built = [k for k, (s, _) in status.items() if s == "built"]
    lost = [k for k, (s, why) in status.items() if s == "failed" and "Ray head" in why and "stopped answering" in why]
    assert ("m0", "a10") in built and len(built) + len(lost) == 6, status
    assert lost and report["counts"]["built"] == len(built) and report["counts"]["failed"] == len(lost)
    for model, profile in built:  # committed and complete
        assert (tmp_path / "out" / model / profile / "model.plan").is_file()
    for model, profile in lost:
        assert not (tmp_path / "out" / model / profile).exists()
    # The table on stdout names every cell, lost ones failed (rich may wrap the reason over lines).
    assert out.count("built") == len(built) and out.count("failed") == len(lost), out


def test_ray_that_cannot_start_reports_the_cached_cells(tmp_path: Path) -> None:
    """Ray failing to start (here: its socket path over the 107-byte limit) was an internal error (exit 3, no table,
    no matrix.json); now every cell not cached is failed with Ray's reason, the cached ones are reported, exit 1."""
    for i in range(2):
        _model(tmp_path / f"m{i}.onnx", f"ray-start-{i}")
    head = '[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "m0.onnx"\nname = "m0"\n'
    (tmp_path / "one.toml").write_text(head)
    (tmp_path / "two.toml").write_text(head + '[[model]]\npath = "m1.onnx"\nname = "m1"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRTFORGE_TEST_", "RAY_"))}
    trtforge = str(BIN / "trtforge")
    done = subprocess.run([trtforge, "build-matrix", "one.toml", "-o", "out"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    long_dir = tmp_path / ("x" * 110)
    long_dir.mkdir()
    env.update(RAY_TMPDIR=str(long_dir), RAY_AUTH_MODE="disabled")
    res = subprocess.run([trtforge, "build-matrix", "two.toml", "-o", "out", "--executor", "ray"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    report = json.loads((tmp_path / "out" / "matrix.json").read_text())
    status = {c["model"]: (c["status"], c["reason"]) for c in report["cells"]}
    assert status["m0"] == ("cached", "") and status["m1"][0] == "failed", status
    assert "Ray could not start" in status["m1"][1] and "107 bytes" in status["m1"][1], status
    assert "cached" in res.stdout and "failed" in res.stdout, res.stdout
