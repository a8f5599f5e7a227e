"""The exit contract against the machine's state (held-out QA, round 3): a full disk or quota, a name over the
filesystem's limit, a deleted current folder, closed standard streams, garbage in the environment, the umask.

Each was exit 3 'internal error ... (a bug: report it)' or worse: ENOSPC/EFBIG and ENAMETOOLONG out of every writing
command; a report or a second --save file left beside a model whose write failed; ``trtforge ... 2>&-`` exit 3
with nothing written (Python leaves sys.stderr None); ``TRTFORGE_LORA_ALIAS=true`` read as off. Now: exit 2, one
line naming the file and what to do, nothing left behind.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtforge.build_engine.core import env
from trtforge_testing import assert_one_line_error, seeded_rng

from . import fixtures as fx

EXE = str(Path(sys.executable).with_name("trtforge"))


@contextlib.contextmanager
def _small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``folder`` (root only: CI runs as root on a machine like the one it targets)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (CI runs the suite as root)")
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("mount -t tmpfs is not permitted here (a container without CAP_SYS_ADMIN)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_full_disk_is_one_line_and_leaves_nothing(cli, tmp_path: Path) -> None:
    llama = fx.llama(tmp_path / "llama.onnx")
    with _small_tmpfs(tmp_path / "full", "8k") as full:  # two 4 KiB pages
        res = cli("fold", llama, "-o", full / "f.onnx", "--report", full / "r.json")
        assert_one_line_error(res, 2, str(full / "f.onnx"), "no space left on device", str(full), "free space")
        # diff --save writes three files: the third does not fit, and none is left (the first two were)
        res = cli("diff", llama, llama, "--save", full / "d.json")
        assert_one_line_error(res, 2, str(full / "d."), "no space left on device")
        res = cli("lora", "pack", fx.adapter(tmp_path / "ad"), "-o", full / "pool.safetensors", "--slots", "64")
        assert_one_line_error(res, 2, "pool.safetensors", "no space left on device")
        assert _left(full) == []
        # The report on the full disk, the model elsewhere: neither (the model was written, then exit 3)
        (full / "fill").write_bytes(b"x" * 8192)
        res = cli("precision", llama, "--to", "fp16", "-o", tmp_path / "p.onnx", "--report", full / "r.json")
        assert_one_line_error(res, 2, "r.json", "no space left on device")
        assert not (tmp_path / "p.onnx").exists() and _left(full) == ["fill"]


def _limited(limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_file_size_limit_is_one_line(tmp_path: Path) -> None:
    """EFBIG (a per-process file size limit, or a filesystem's): no root needed."""
    llama = fx.llama(tmp_path / "llama.onnx")
    (tmp_path / "out").mkdir()
    proc = subprocess.run([EXE, "quantize", str(llama), "--mode", "int8", "-o", str(tmp_path / "out" / "q.onnx"),
                           "--report", str(tmp_path / "out" / "q.json")], capture_output=True, text=True,
                          preexec_fn=lambda: _limited(64 * 1024), timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "q.onnx: cannot write it: file too large" in lines[0] and "Traceback" not in proc.stderr
    assert _left(tmp_path / "out") == []


def test_name_too_long_and_deleted_cwd(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = fx.tiny_model(tmp_path / "in.onnx")
    long = "a" * 256
    for argv in (["fold", tiny, "-o", tmp_path / f"{long}.onnx"],
                 ["fold", tmp_path / f"{long}.onnx", "-o", tmp_path / "x.onnx"],
                 ["kv-plan", "--profile", "a100", "--model", tmp_path / f"{long}.json"],
                 ["build", tiny, "--profile", "a100", "-o", tmp_path / long]):
        assert_one_line_error(cli(*argv), 2, "file name over 255 bytes", "choose a shorter path")
    # The longest name that leaves room for '.data' still works with external data (its claim's name is bounded)
    (tmp_path / "ext").mkdir()
    ext = fx.external_model(tmp_path / "ext" / "m.onnx")
    name = f"{'b' * 245}.onnx"
    assert cli("fold", ext, "-o", tmp_path / "ext" / name).code == 0
    assert _left(tmp_path / "ext") == sorted(["m.onnx", "m.onnx.data", name])  # its 512 bytes are inline
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert_one_line_error(cli("fold", tiny, "-o", "out.onnx"), 2, "current folder was deleted", "cd to")
    assert _left(tmp_path) == ["ext", "in.onnx"]


def _close(fds: tuple[int, ...]) -> None:
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize("closed", [(1,), (2,), (0, 1, 2)], ids=["stdout", "stderr", "all"])
def test_closed_standard_streams(tmp_path: Path, closed: tuple[int, ...]) -> None:
    tiny = fx.tiny_model(tmp_path / "in.onnx")

    def run(*argv: str) -> int:
        return subprocess.run([EXE, *argv], preexec_fn=lambda: _close(closed), timeout=120).returncode

    assert run("fold", str(tiny), "-o", str(tmp_path / "out.onnx"), "--report", str(tmp_path / "r.json")) == 0
    assert (tmp_path / "out.onnx").stat().st_size > 0 and (tmp_path / "r.json").read_text().startswith("{")
    assert run("fold", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o2.onnx")) == 2
    assert _left(tmp_path) == ["in.onnx", "out.onnx", "r.json"]


@pytest.mark.parametrize("knob", [k for k in env.KNOBS if k.kind != "text"], ids=lambda k: k.name)
def test_garbage_in_an_environment_knob(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        knob: env.Knob) -> None:
    tiny = fx.tiny_model(tmp_path / "in.onnx")
    monkeypatch.setenv(knob.name, "true" if knob.kind == "flag" else "many")
    assert_one_line_error(cli("fold", tiny, "-o", tmp_path / "out.onnx"), 2, knob.name, "unset it")
    assert _left(tmp_path) == ["in.onnx"]
    monkeypatch.setenv(knob.name, "")  # empty is the default
    assert cli("fold", tiny, "-o", tmp_path / "out.onnx").code == 0


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_outputs_get_the_umask_mode(cli, tmp_path: Path, umask: int) -> None:
    tiny = fx.tiny_model(tmp_path / "in.onnx")
    old = os.umask(umask)
    try:
        assert cli("fold", tiny, "-o", tmp_path / "o.onnx", "--report", tmp_path / "r.json").code == 0
        assert cli("lora", "pack", fx.adapter(tmp_path / "ad"), "-o", tmp_path / "p.safetensors").code == 0
        assert cli("kv-plan", "--profile", "a100", "--model", "llama-3.1-8b", "--json", tmp_path / "k.json").code == 0
    finally:
        os.umask(old)
    for name in ("o.onnx", "r.json", "p.safetensors", "k.json"):
        assert oct(os.stat(tmp_path / name).st_mode & 0o777) == oct(0o666 & ~umask), name


def test_external_weights_saved_to_another_filesystem(cli, tmp_path: Path) -> None:
    """fold copies an input's external weights file to file (copy_file_range): across filesystems (the model on disk,
    the output on /dev/shm) the kernel refuses with EXDEV, and fold exited 3. Now the bytes are read and written."""
    import tempfile

    import numpy as np
    import onnx
    from onnx import numpy_helper

    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second writable filesystem (/dev/shm) for the output")
    from onnx import TensorProto, helper

    w = numpy_helper.from_array(seeded_rng("exdev").standard_normal((512, 1024)).astype(np.float32), "w")  # 2 MiB:
    graph = helper.make_graph(  # above lazy_weights.LAZY_MIN_BYTES, so it stays on disk and is copied file to file
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1024])], [w])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src, save_as_external_data=True,
              location="m.onnx.data", size_threshold=0)
    other = Path(tempfile.mkdtemp(prefix="trtforge-qa-", dir=shm))
    try:
        assert cli("fold", src, "-o", other / "o.onnx").code == 0
        assert cli("lora", "decompose", fx.injected_model(tmp_path / "l.onnx"), "-o", other / "l.onnx").code == 0
        got, want = onnx.load(other / "o.onnx"), onnx.load(src)
        assert [np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
                for a, b in zip(got.graph.initializer, want.graph.initializer, strict=True)] == [True]
    finally:
        import shutil

        shutil.rmtree(other, ignore_errors=True)


def test_read_only_filesystem_is_one_line(cli, tmp_path: Path) -> None:
    """A folder a command creates (triton --repo, build-matrix -o, demo --workdir) on a read-only filesystem: EROFS
    from mkdir was exit 3."""
    matrix = tmp_path / "mx.toml"
    matrix.write_text(f'[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "{fx.tiny_model(tmp_path / "m.onnx")}"\n')
    with _small_tmpfs(tmp_path / "ro", "64k") as ro:
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        for argv in (["build-matrix", matrix, "-o", ro / "out"], ["demo", "--workdir", ro / "demo"],
                     ["fold", tmp_path / "m.onnx", "-o", ro / "f.onnx"]):
            assert_one_line_error(cli(*argv), 2, str(ro), "ead-only")


def test_unwritable_home_keeps_a_plot_run_quiet(tmp_path: Path) -> None:
    """HOME without a writable config folder: matplotlib's two warnings about a temporary cache were the only
    stderr of a successful simulate --plot."""
    environ = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME")}
    # The config folder (HOME/.config or XDG_CONFIG_HOME) cannot be made under /proc; the font cache stays where it
    # is (a fresh one takes seconds to build).
    proc = subprocess.run([EXE, "simulate", "--trace", "synthetic:20", "--profile", "a100", "--model", "llama-3.1-8b",
                           "--policy", "cache-aware", "--plot", str(tmp_path / "s.png")], capture_output=True,
                          text=True, env={**environ, "XDG_CONFIG_HOME": "/proc/none"}, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_demo_says_why_its_first_step_failed(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a full disk the demo's first step (writing the example model) failed without a word on stderr, followed by
    one 'no such file' error per later step: the cause was only in summary.md. Later steps are left out here."""
    import errno

    from trtforge.examples import demo

    def full(work: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(demo, "_make_example", full)
    monkeypatch.setattr(demo, "plan_steps", lambda work: [])
    res = cli("demo", "--workdir", tmp_path / "demo")
    assert res.code == 1
    assert res.err.splitlines()[0] == "error: example model: OSError: [Errno 28] No space left on device"


def test_output_encoding_that_cannot_spell_the_path(tmp_path: Path) -> None:
    """PYTHONIOENCODING=ascii (or a C locale without UTF-8): the summary naming 'ö.onnx' raised UnicodeEncodeError
    after the model was written (exit 3 with the output there). Now the name is escaped, as on stderr."""
    tiny = fx.tiny_model(tmp_path / "in.onnx")
    proc = subprocess.run([EXE, "fold", str(tiny), "-o", str(tmp_path / "ö.onnx")], capture_output=True,
                          env={**os.environ, "PYTHONIOENCODING": "ascii"}, timeout=120)
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
    assert b"\\xf6.onnx: 1 -> 1 nodes" in proc.stdout and (tmp_path / "ö.onnx").stat().st_size > 0


@pytest.mark.parametrize("argv", [["--version"], ["kv-plan", "--profile", "a100", "--model", "llama-3.1-8b"],
                                  ["fold", "--help"], ["lora", "inject", "--help"], ["--help"]],
                         ids=["version", "kv-plan", "fold-help", "lora-inject-help", "help"])
def test_stdout_on_a_full_disk(argv: list[str]) -> None:
    """stdout redirected to a full disk (/dev/full): --version's print escaped as a traceback (exit 1), a command's
    as 'internal error' (exit 3)."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([EXE, *argv], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "stdout" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv", [["fold", "--help"], ["lora", "inject", "--help"], ["--help"], ["--version"]],
                         ids=["fold-help", "lora-inject-help", "help", "version"])
def test_stdout_a_closed_pipe(argv: list[str]) -> None:
    """Help into a pipe whose reader has left: 141 and no message, as a Unix tool killed by SIGPIPE (a sub-command's
    help exited 0 having written nothing: argparse ignores a failed write)."""
    import os

    rfd, wfd = os.pipe()
    os.close(rfd)
    try:
        proc = subprocess.run([EXE, *argv], stdout=wfd, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(wfd)
    assert (proc.returncode, proc.stderr) == (141, ""), proc.stderr


def test_stderr_on_a_full_disk(tmp_path: Path) -> None:
    """stderr on a full disk (2>/dev/full): a progress line that could not be shown made fold write nothing and exit
    1; a missing input exited 1 instead of 2. Diagnostics that cannot be shown are dropped."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    tiny = fx.tiny_model(tmp_path / "in.onnx")
    with open("/dev/full", "w") as full:
        def run(*argv: str) -> int:
            return subprocess.run([EXE, *argv], stdout=subprocess.DEVNULL, stderr=full, timeout=120).returncode

        assert run("fold", str(tiny), "-o", str(tmp_path / "o.onnx"), "--progress") == 0
        assert run("fold", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o2.onnx")) == 2
    assert _left(tmp_path) == ["in.onnx", "o.onnx"]
