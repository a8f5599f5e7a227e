"""Two runs writing at once (held-out QA, round 3), made deterministic by doing the other run's step at the instant
it raced:

- runs writing into one folder share ``.trtforge-staging``: one removing it (empty) between the other's ``mkdir``
  and ``mkdtemp`` made the second fail 'cannot write there (No such file or directory)', exit 2 (1 in 60 of six
  parallel ``kv-plan --json out/kN.json``);
- a sweep that found ``.lock`` between its creation and its ``flock`` took the entry for a dead run's and deleted
  the folder a live run was writing;
- an output folder written without ``--force`` that another run created meanwhile was replaced (both exited 0;
  the first run's engine silently gone);
- ``build-matrix``'s killed workers left their work folders (a copy of the model, a half plan) in $TMPDIR;
- its lock file was 0644 whatever the umask (a group sharing OUTROOT under umask 002 was locked out);
- two saves of one model with external data could both name their weights OUT.onnx.data: the second's data rename
  landed under the first's published model (a model with the other run's weights, both runs exit 0).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from trtforge.build_engine.core import fsutil, staging
from trtforge.build_engine.core.errors import InputError


def test_staging_folder_removed_by_another_run_in_between(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tempfile.mkdtemp
    removed: list[str] = []

    def other_run_cleans_up_first(*args: object, **kw: object) -> str:
        base = Path(str(kw["dir"]))
        if not removed:  # the other run's 'rmdir .trtforge-staging' lands between our mkdir and mkdtemp
            base.rmdir()
            removed.append(str(base))
        return real(*args, **kw)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(staging.tempfile, "mkdtemp", other_run_cleans_up_first)
    fsutil.write_text(tmp_path / "out.txt", "hello")
    assert removed and (tmp_path / "out.txt").read_text() == "hello"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_sweep_between_lock_creation_and_flock_keeps_the_live_entry(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real = fcntl.flock
    swept: list[list[str]] = []

    def other_run_sweeps_first(fd: int, op: int) -> None:
        if not swept:
            swept.append([])  # once (the sweep's own flock calls come here too)
            swept[0] = staging.sweep(tmp_path)  # the other run starts while ours has not locked yet
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", other_run_sweeps_first)
    with staging.staging_dir(tmp_path, "out.txt") as entry:
        assert swept == [[]] and entry.is_dir()  # nothing was removed
        (entry / "x").write_text("mine")
        assert (entry / "x").read_text() == "mine"


@pytest.mark.parametrize("no_exchange", ["", "1"], ids=["renameat2", "fallback"])
def test_folder_made_meanwhile_is_not_replaced_without_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             no_exchange: str) -> None:
    monkeypatch.setenv(staging.NO_EXCHANGE_ENV, no_exchange)
    dest = tmp_path / "eng"
    with pytest.raises(InputError, match="created by another run.*--force"), fsutil.atomic_dir(dest) as tmp:
        (tmp / "model.plan").write_text("ours")
        dest.mkdir()  # the other run publishes its engine while ours builds
        (dest / "model.plan").write_text("theirs")
    assert (dest / "model.plan").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eng"]  # our staging folder is gone
    # An empty folder made meanwhile is not taken either (a plain rename would replace it).
    other = tmp_path / "other"
    with pytest.raises(InputError, match="created by another run"), fsutil.atomic_dir(other) as tmp:
        (tmp / "model.plan").write_text("ours")
        other.mkdir()
    assert not any(other.iterdir())
    with fsutil.atomic_dir(dest, force=True) as tmp:  # with --force the other run's folder is replaced
        (tmp / "model.plan").write_text("ours")
        (tmp_path / "third").mkdir()
    assert (dest / "model.plan").read_text() == "ours"


def test_matrix_killed_worker_leaves_no_work_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds the engines (pip install 'trtforge[rtx]')")
    from trtforge.build_engine.matrix.driver import run_matrix
    from trtforge.build_engine.matrix.spec import load_matrix
    from trtforge.build_engine.matrix.worker import KILL_ONCE_ENV

    from ..contract import fixtures as fx

    marks, tmpdir = tmp_path / "kills", tmp_path / "tmpdir"
    marks.mkdir()
    tmpdir.mkdir()
    monkeypatch.setenv(KILL_ONCE_ENV, str(marks))  # the cell's first worker SIGKILLs itself mid-build
    monkeypatch.setenv("TMPDIR", str(tmpdir))  # where the spawned workers' temporary folders went
    fx.tiny_model(tmp_path / "m.onnx")
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a100"]\nbackend = "tensorrt-rtx"\n[[model]]\n'
                                      'path = "m.onnx"\nname = "m"\n[model.pipeline]\nfold = true\n')
    report = run_matrix(load_matrix(tmp_path / "mx.toml"), tmp_path / "out", jobs=1, retries=1)
    assert [(c.status, c.attempts) for c in report.cells] == [("built", 2)]
    assert not [p.name for p in tmpdir.iterdir() if p.name.startswith("trtforge-cell-")]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".trtforge-matrix.lock", "m", "matrix.json"]


def test_matrix_lock_file_mode_follows_the_umask(tmp_path: Path) -> None:
    from trtforge.build_engine.matrix.driver import LOCK_FILE, _exclusive

    old = os.umask(0o002)
    try:
        with _exclusive(tmp_path):
            pass
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / LOCK_FILE).st_mode & 0o777) == oct(0o664)


def _external_model(path: Path, graph_name: str, seed: int) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtforge_testing import seeded_rng

    w = numpy_helper.from_array(seeded_rng(f"concurrent-{seed}").standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], graph_name,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path, save_as_external_data=True,
              location=f"{path.name}.data", size_threshold=0)
    return path


def _stopped(proc: subprocess.Popen[str]) -> None:
    """Wait until ``proc`` stopped itself (TRTFORGE_TEST_KILL_AT=...:SIGSTOP) or ended."""
    import time

    while proc.poll() is None:
        if Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return
        time.sleep(0.02)
    raise AssertionError(proc.communicate()[1])


def test_two_saves_of_one_output_never_pair_a_model_with_the_others_weights(tmp_path: Path) -> None:
    """B stages its data as o.onnx.data and stops; A (o.onnx.data still free) stages the same name, renames its data
    in and stops; B commits (its data over A's), then A publishes its model: A's graph with B's weights, exit 0 both.
    Now A sees B's claim on o.onnx.data and takes another name; the result is one run's model with its own weights."""
    import onnx
    from onnx import numpy_helper

    exe = str(Path(sys.executable).with_name("trtforge"))
    srcs = {name: _external_model(tmp_path / f"{name}.onnx", name, seed) for seed, name in enumerate(("ga", "gb"))}
    (tmp_path / "out").mkdir()

    def fold(src: str, point: str) -> subprocess.Popen[str]:
        return subprocess.Popen([exe, "fold", str(srcs[src]), "-o", str(tmp_path / "out" / "o.onnx")],
                                env={**os.environ, staging.KILL_AT_ENV: point}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)

    b = fold("gb", "model:staged:SIGSTOP")
    _stopped(b)
    a = fold("ga", "model:data-renamed:SIGSTOP")
    _stopped(a)
    for proc in (b, a):
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=60) == 0, proc.communicate()[1]
    out = onnx.load(tmp_path / "out" / "o.onnx")
    src = onnx.load(srcs[out.graph.name])  # the run whose model was published last
    assert numpy_helper.to_array(out.graph.initializer[0]).tobytes() == \
        numpy_helper.to_array(src.graph.initializer[0]).tobytes()
    named = {e.value for t in onnx.load(tmp_path / "out" / "o.onnx", load_external_data=False).graph.initializer
             for e in t.external_data if e.key == "location"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted({"o.onnx", *named})


def test_interrupted_triton_run_keeps_the_entry_another_run_put_in_the_repo_it_made(tmp_path: Path) -> None:
    """Run A creates REPO and stops before its commit; run B writes REPO/m2; A is interrupted: it removed the repository
    it had created with rmtree, B's committed entry with it."""
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds the engine (pip install 'trtforge[rtx]')")
    from ..contract import fixtures as fx

    exe = str(Path(sys.executable).with_name("trtforge"))
    engine, repo = fx.engine(tmp_path / "eng"), tmp_path / "repo"
    a = subprocess.Popen([exe, "triton", str(engine), "--repo", str(repo), "--name", "m"], stderr=subprocess.PIPE,
                         env={**os.environ, staging.KILL_AT_ENV: "dir:staged:SIGSTOP"}, stdout=subprocess.DEVNULL,
                         text=True)
    _stopped(a)
    b = subprocess.run([exe, "triton", str(engine), "--repo", str(repo), "--name", "m2"], capture_output=True,
                       text=True, timeout=120)
    assert b.returncode == 0, b.stderr
    os.kill(a.pid, signal.SIGTERM)
    os.kill(a.pid, signal.SIGCONT)
    assert a.wait(timeout=60) == 143
    assert sorted(p.name for p in repo.iterdir()) == ["m2"]
    assert (repo / "m2" / "1" / "model.plan").read_bytes() == (engine / "model.plan").read_bytes()


def _waits_on_group_lock_or_ends(proc: subprocess.Popen[str]) -> None:
    """Until ``proc`` ended or opened a ``.group`` lock file (where it waits for the other run)."""
    import time

    while proc.poll() is None:
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{proc.pid}/fd/{fd}").endswith(".group")
                   for fd in os.listdir(f"/proc/{proc.pid}/fd")):
                return
        time.sleep(0.02)


def test_model_and_report_of_one_run_when_two_write_them_at_once(tmp_path: Path) -> None:
    """A commits its model and stops before its report's rename; B writes model and report; A's report then landed
    beside B's model (both exit 0). Now B waits for A's group of outputs to be complete, then replaces both."""
    import json

    exe = str(Path(sys.executable).with_name("trtforge"))
    srcs = {name: _external_model(tmp_path / f"{name}.onnx", name, seed) for seed, name in enumerate(("ga", "gb"))}
    out, report = tmp_path / "out" / "o.onnx", tmp_path / "out" / "r.json"
    out.parent.mkdir()

    def fold(src: str, point: str = "") -> subprocess.Popen[str]:
        return subprocess.Popen([exe, "fold", str(srcs[src]), "-o", str(out), "--report", str(report)],
                                env={**os.environ, staging.KILL_AT_ENV: point}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)

    a = fold("ga", "model:committed:SIGSTOP")
    _stopped(a)
    b = fold("gb")
    _waits_on_group_lock_or_ends(b)
    os.kill(a.pid, signal.SIGCONT)
    assert a.wait(timeout=60) == 0 and b.wait(timeout=60) == 0
    import onnx

    assert json.loads(report.read_text())["input"] == str(srcs[onnx.load(out).graph.name])
    assert not (out.parent / staging.STAGING).exists()
