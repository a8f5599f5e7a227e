"""SIGINT / SIGTERM at any moment of a real ``trtforge`` process: while its modules import, while it works, while it
commits and after it is done. Each signal ends the process with 130 / 143 and one ``error: interrupted`` line, or
(when it came after the command finished) with the command's own exit code; never a traceback, never a death by the
signal, never a half-written output or a staging folder left, and an older output is intact unless the new one is
complete.

The delays are measured from the moment trtforge's first line runs (the process catches SIGTERM, seen in
``/proc/PID/status``): before it, the interpreter itself is starting (its ``site`` import) and a signal there has
Python's default effect, which no code of trtforge can change.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from trtforge_testing import relu_model_file, seeded_rng

CONSOLE = Path(sys.executable).with_name("trtforge")
DELAYS = (0.0, 0.02, 0.06, 0.2, 0.6, 2.0)

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status (Linux)")


def _catches_sigterm(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((int(ln.split()[1], 16) for ln in text.splitlines() if ln.startswith("SigCgt:")), 0)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def _signal_at(argv: list[str], signum: int, delay: float, cwd: Path) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTFORGE_TEST_")}
    proc = subprocess.Popen([str(CONSOLE), *argv], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while proc.poll() is None and not _catches_sigterm(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.0005)
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def _model(path: Path, label: str) -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = seeded_rng(label)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype("float32"), "w")
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("MatMul", ["xi", "w"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def _outcomes(tmp_path: Path, argv_for: list[str], compared: list[str], names: set[str],
              delays: tuple[float, ...] = DELAYS) -> None:
    """``argv_for`` names ``NEW`` (the model written); ``compared`` are output files whose bytes are reproducible,
    ``names`` what the working folder holds after any run. Signals alternate SIGINT, SIGTERM over the delays."""
    new, old = tmp_path / "new.onnx", tmp_path / "old.onnx"
    _model(new, "signals-new")
    _model(old, "signals-old")
    work = tmp_path / "work"
    work.mkdir()

    def argv(src: Path) -> list[str]:
        return [str(src) if a == "NEW" else a for a in argv_for]

    def run(src: Path) -> None:
        res = subprocess.run([str(CONSOLE), *argv(src)], cwd=work, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr

    run(new)
    want_new = {o: _digest(work / o) for o in compared}
    run(old)
    want_old = {o: _digest(work / o) for o in compared}
    assert want_old != want_new
    for n, delay in enumerate(delays):
        signum, code = ((signal.SIGINT, 130), (signal.SIGTERM, 143))[n % 2]
        rc, err = _signal_at(argv(new), signum, delay, work)
        where = (signal.Signals(signum).name, delay, rc, err)
        assert "Traceback" not in err, where
        after = {o: _digest(work / o) for o in compared}
        if rc == 0:  # the signal came once the command was done: its outputs are complete
            assert not err.strip() or "error" not in err, where
            assert after == want_new, where
        else:
            assert rc == code, where
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith("error: interrupted by"), where
            assert after in (want_old, want_new), where  # a signal inside the commit lets it finish
        assert {p.name for p in work.iterdir()} == names, where  # no staging folder, no temporary file
        if after != want_old:
            run(old)


def test_fold_signalled_at_any_moment(tmp_path: Path) -> None:
    _outcomes(tmp_path, ["fold", "NEW", "-o", "out.onnx", "--report", "out.json"], ["out.onnx"],
              {"out.onnx", "out.json"})


def test_precision_signalled_at_any_moment(tmp_path: Path) -> None:
    _outcomes(tmp_path, ["precision", "NEW", "-o", "out.onnx", "--to", "fp16"], ["out.onnx"], {"out.onnx"})


def test_build_signalled_at_any_moment(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    _outcomes(tmp_path, ["build", "NEW", "--profile", "a100", "-o", "eng", "--force", "--no-progress",
                         "--backend", "tensorrt-rtx"], ["eng/model.onnx"], {"eng"}, delays=(0.0, 0.3, 2.0))


_SLOW_IMPORT = """
import sys, time
sys.argv[0] = "trtforge"
class Slow:
    def find_spec(self, name, path=None, target=None):
        if name == "trtforge.build_engine.cli":
            print("importing", flush=True)
            time.sleep(3)
        return None
sys.meta_path.insert(0, Slow())
from trtforge.build_engine.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_while_the_console_imports(tmp_path: Path, signum: int, code: int) -> None:
    """The console script's own import of its CLI module, slowed down so that the signal surely lands inside it
    (it took tens of milliseconds, in which a Ctrl-C printed a KeyboardInterrupt traceback and a SIGTERM killed the
    process without a word): the import ends, then the command exits with one line and writes nothing."""
    relu_model_file(tmp_path / "in.onnx")
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_IMPORT, "fold", "in.onnx", "-o", "out.onnx"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "importing"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, (proc.returncode, err)
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        f"error: interrupted by {signal.Signals(signum).name}; no partial output was left"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx"]
