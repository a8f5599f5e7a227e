"""Held-out CLI contract cases, round 5: build and triton with inputs the other tests never used (real TensorRT-RTX
builds of tiny models)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from trtforge_testing import assert_one_line_error, graph_model, run_console


@pytest.mark.parametrize(("nodes", "dtype", "needles"), [
    ([h.make_node("Identity", ["x"], ["y"])], T.INT16, ("node -1", "INT16")),
    ([h.make_node("Identity", ["x"], ["y"])], T.STRING, ("node -1", "STRING")),
    ([h.make_node("Cast", ["x"], ["t"], to=T.UINT16), h.make_node("Cast", ["t"], ["y"], to=T.FLOAT)], T.FLOAT,
     ("Cast", "UINT16")),
])
def test_a_dtype_tensorrt_cannot_take_is_one_error_line(tmp_path: Path, nodes: list, dtype: int,
                                                        needles: tuple[str, ...]) -> None:
    """TensorRT's ONNX parser prints 'Unsupported ONNX data type: INT16 (5)' on fd 2 itself before it fails, so a
    model with an int16/string input (or a Cast to uint16) printed a line above the one 'error:' line; now the
    error line holds that line's words and stands alone (a subprocess: the print bypasses Python's sys.stderr)."""
    pytest.importorskip("tensorrt_rtx")
    out_dtype = T.FLOAT if dtype == T.FLOAT else dtype
    model = graph_model(nodes, [("x", dtype, ["batch", 4])], [("y", out_dtype, ["batch", 4])])
    onnx.save(model, tmp_path / "m.onnx")
    res = run_console(["build", str(tmp_path / "m.onnx"), "--profile", "a10", "-o", str(tmp_path / "e"),
                       "--no-progress"])
    assert_one_line_error(res, 2, "m.onnx", "cannot parse the model", *needles)
    assert not (tmp_path / "e").exists()


def _engine(cli, tmp_path: Path) -> Path:
    """A real TensorRT-RTX a10 build of y = Relu(x), x [batch, 8]."""
    pytest.importorskip("tensorrt_rtx")
    model = graph_model([h.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, ["batch", 8])],
                        [("y", T.FLOAT, ["batch", 8])])
    onnx.save(model, tmp_path / "m.onnx")
    res = cli("build", tmp_path / "m.onnx", "--profile", "a10", "-o", tmp_path / "e", "--no-progress")
    assert res.code == 0, res.err
    return tmp_path / "e"


def test_check_takes_a_symlinked_entry_by_its_link_name(cli, tmp_path: Path) -> None:
    """tritonserver names a model by REPO's child (a symlink too) and wants config.pbtxt's name equal to it
    ('unexpected directory name ... directory name must equal model name'). --check resolved the link: REPO/alias ->
    store/dyn with name "dyn" passed, and a link named as its config was refused."""
    engine = _engine(cli, tmp_path)
    assert cli("triton", engine, "--repo", tmp_path / "store", "--name", "dyn").code == 0
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "alias").symlink_to(tmp_path / "store" / "dyn")
    for target in ("repo/alias", "repo"):
        assert_one_line_error(cli("triton", "--check", tmp_path / target), 1, "name 'dyn'", "'alias'")
    assert cli("triton", engine, "--repo", tmp_path / "store", "--name", "alias").code == 0
    (tmp_path / "repo" / "alias").unlink()
    (tmp_path / "repo" / "alias").symlink_to(tmp_path / "store" / "alias")
    (tmp_path / "repo" / "named").symlink_to(tmp_path / "store" / "alias")  # a second link: named 'alias' inside
    assert_one_line_error(cli("triton", "--check", tmp_path / "repo"), 1, "name 'alias'", "'named'")
    (tmp_path / "repo" / "named").unlink()
    for target in ("repo/alias", "repo"):
        res = cli("triton", "--check", tmp_path / target)
        assert res.code == 0, res.err
        assert "alias is a valid Triton entry" in res.out


def test_check_of_a_repository_whose_folders_all_lack_a_config(cli, tmp_path: Path) -> None:
    """--check REPO where REPO's only folder is an engine folder copied in (no config.pbtxt anywhere) took REPO for an
    entry: 'REPO/config.pbtxt: missing; write it', a fix that turns the repository into a broken model. Now the
    folder tritonserver trips on is named with its fix; a folder with a version folder but no config is still
    checked as an entry."""
    import shutil

    engine = _engine(cli, tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()

    shutil.copytree(engine, repo / "e")
    res = cli("triton", "--check", repo)
    assert_one_line_error(res, 1, f"{repo / 'e'}: no config.pbtxt", "--name e", "rm -rf")
    assert "repo/config.pbtxt" not in res.err
    entry = tmp_path / "lost" / "m"
    (entry / "1").mkdir(parents=True)
    assert_one_line_error(cli("triton", "--check", entry), 1, f"{entry / 'config.pbtxt'}: missing")


@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_while_tensorrt_calls_the_logger_is_one_line(tmp_path: Path, sig: str, code: int) -> None:
    """A signal that arrived while TensorRT was inside the Python logger (creating the builder, parsing) raised
    Interrupted in the callback, which TensorRT swallowed and printed as '[ERROR] Exception caught in log()' with a
    13-line stack above the 'interrupted' line. Now signals wait for the parse block's end: one line, no output.
    (TRTFORGE_TEST_KILL_AT=build:log signals the process from the logger callback; real signals hit it too.)"""
    import os

    pytest.importorskip("tensorrt_rtx")
    model = graph_model([h.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, ["batch", 8])],
                        [("y", T.FLOAT, ["batch", 8])])
    onnx.save(model, tmp_path / "m.onnx")
    env = {**os.environ, "TRTFORGE_TEST_KILL_AT": f"build:log:{sig}"}
    res = run_console(["build", str(tmp_path / "m.onnx"), "--profile", "a10", "-o", str(tmp_path / "e"),
                       "--no-progress"], env=env)
    assert_one_line_error(res, code, f"interrupted by {sig}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_a_library_turns_into_its_own_error_is_still_the_signal(sig: str, code: int) -> None:
    """A SIGTERM while numpy was being imported (build at ~0.4 s) made numpy raise ImportError('_multiarray_umath
    failed to import') from the Interrupted, and the command exited 3 'internal error'. Now an exception leaving the
    command while a signal is pending is that signal's Interrupted (130 / 143). A real signal, a real wrapper."""
    import os
    import signal
    import time

    from trtforge.build_engine.core import interrupt

    with pytest.raises(interrupt.Interrupted) as info, interrupt.handling():
        try:
            os.kill(os.getpid(), getattr(signal, sig))
            time.sleep(5)  # the handler raises here
        except KeyboardInterrupt as exc:
            raise ImportError("numpy._core.umath failed to import") from exc
    assert info.value.exit_code == code
    with pytest.raises(ValueError, match="plain"), interrupt.handling():  # no signal: the error is left alone
        raise ValueError("plain")


def test_a_repository_that_is_a_mount_point_is_said_to_stage_inside(cli, tmp_path: Path) -> None:
    """A repository that is a mount point (a container volume: --repo /models) has no folder of its filesystem
    beside it, so the entry was staged inside it (REPO/.trtforge-staging) without a word, although the README said
    'beside the repository, never inside it': a kill -9 there left a folder on which tritonserver fails to load the
    whole repository. The write now says so once, with the fix; an ordinary repository gets no such line."""
    import os
    import shutil
    import uuid

    mount = Path("/dev/shm")
    if not (os.path.ismount(mount) and os.access(mount, os.W_OK)):
        pytest.skip("no writable mount point (/dev/shm) here")
    engine = _engine(cli, tmp_path)
    name = f"trtforge-test-{uuid.uuid4().hex[:12]}"
    try:
        res = cli("triton", engine, "--repo", mount, "--name", name, "--no-warmup")
        assert res.code == 0, res.err
        warnings = [ln for ln in res.err.splitlines() if "mount point" in ln]
        assert len(warnings) == 1 and ".trtforge-staging" in warnings[0] and "parent" in warnings[0], res.err
    finally:
        shutil.rmtree(mount / name, ignore_errors=True)
    res = cli("triton", engine, "--repo", tmp_path / "repo", "--name", "m", "--no-warmup")
    assert res.code == 0 and "mount point" not in res.err, res.err


def test_check_of_a_version_folder_names_its_entry(cli, tmp_path: Path) -> None:
    """--check REPO/NAME/1 (a version folder of a valid entry) failed as a broken entry, exit 1:
    'REPO/NAME/1/config.pbtxt: missing; write it with trtforge triton ...'. It is a wrong argument: exit 2 naming
    the entry to pass."""
    engine = _engine(cli, tmp_path)
    assert cli("triton", engine, "--repo", tmp_path / "repo", "--name", "m").code == 0
    assert_one_line_error(cli("triton", "--check", tmp_path / "repo" / "m" / "1"), 2, "version folder 1",
                          f"{tmp_path / 'repo' / 'm'}")
    assert cli("triton", "--check", tmp_path / "repo" / "m").code == 0


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_external_data_that_is_not_a_regular_file_is_named_so(cli, tmp_path: Path, kind: str) -> None:
    """A model whose external data location is a FIFO or a folder was refused as 'but that file is missing; copy
    it beside the model', though it is there; now the line says it is not a regular file."""
    import os

    import numpy as np
    from onnx import numpy_helper as nh

    model = graph_model([h.make_node("MatMul", ["x", "w"], ["y"])], [("x", T.FLOAT, ["batch", 8])],
                        [("y", T.FLOAT, ["batch", 8])], inits=[nh.from_array(np.eye(8, dtype=np.float32), "w")])
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    (tmp_path / "m.data").unlink()
    if kind == "fifo":
        os.mkfifo(tmp_path / "m.data")
    else:
        (tmp_path / "m.data").mkdir()
    for argv in (["build", tmp_path / "m.onnx", "--profile", "a10", "-o", tmp_path / "e", "--no-progress"],
                 ["fold", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx"]):
        assert_one_line_error(cli(*argv), 2, "'m.data'", "not a regular file")
    assert not (tmp_path / "e").exists() and not (tmp_path / "o.onnx").exists()


def test_triton_of_an_engine_whose_dim_opt_is_zero(cli, tmp_path: Path) -> None:
    """build --dim past=0:0:8 (a decoder's first step at its opt) builds, but 'trtforge triton' then refused its own
    config, exit 1 'generated config.pbtxt is invalid: model_warmup ... dims [0, 8] do not fit'. The warm-up now
    takes that dim at 1 (inside the profile) and the entry is written and checks."""
    pytest.importorskip("tensorrt_rtx")
    model = graph_model([h.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, ["batch", "past", 8])],
                        [("y", T.FLOAT, ["batch", "past", 8])])
    onnx.save(model, tmp_path / "m.onnx")
    res = cli("build", tmp_path / "m.onnx", "--profile", "a10", "-o", tmp_path / "e", "--no-progress", "--dim",
              "past=0:0:8")
    assert res.code == 0, res.err
    res = cli("triton", tmp_path / "e", "--repo", tmp_path / "repo", "--name", "m")
    assert res.code == 0, res.err
    assert cli("triton", "--check", tmp_path / "repo" / "m").code == 0
    sizes = sorted(p.stat().st_size for p in (tmp_path / "repo" / "m" / "warmup").iterdir())
    assert sizes == [1 * 8 * 4, 1 * 8 * 4]  # one batch-1 row of past 1 x 8 float32 per profile


_BEFORE_HANDLERS = """
import os, signal, sys, time
import trtforge.build_engine.cli as cli
import trtforge.build_engine.cli.profiles as command
def build_parser():  # the command's parser is built before its signal handlers are installed
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    time.sleep(5)
command.build_parser = build_parser
sys.exit(cli.main(["profiles"]))
"""


@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_before_the_command_handlers_is_one_line(sig: str, code: int) -> None:
    """A Ctrl-C while the command module was imported or its parser built (before run_command's handlers) printed
    Python's KeyboardInterrupt traceback, and a SIGTERM there killed the process without a word. Now the console
    entry holds them from its start: one 'interrupted by' line, 130 / 143."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _BEFORE_HANDLERS, sig], capture_output=True, text=True, timeout=60)
    from trtforge_testing import CliResult

    assert_one_line_error(CliResult(proc.returncode, proc.stdout, proc.stderr), code, f"interrupted by {sig}")


def test_a_signal_during_an_import_is_raised_once_the_import_is_done(tmp_path: Path) -> None:
    """A Ctrl-C while a C extension's module initialisation ran Python code (onnx's pybind11 module making its
    enums, reached by 'trtforge triton' at ~0.4 s) raised Interrupted into it: the process died of SIGABRT (exit
    -6, 'Fatal Python error: Aborted') or SIGSEGV. Now a signal inside an import is raised just after it: the module
    imports whole, then Interrupted (a pure-Python module stands in for the extension here)."""
    import importlib
    import sys

    from trtforge.build_engine.core import interrupt

    (tmp_path / "r5_slow_module.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\nfor _ in range(200):\n    time.sleep(0.001)\n"
        "DONE = True\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(interrupt.Interrupted) as info, interrupt.handling():
            importlib.import_module("r5_slow_module")
            import time

            time.sleep(5)  # the retry raises here, right after the import
        assert info.value.exit_code == 143
        assert sys.modules["r5_slow_module"].DONE
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("r5_slow_module", None)


def test_a_file_named_like_the_staging_folder_is_named(cli, tmp_path: Path) -> None:
    """A file (or a broken link) named .trtforge-staging where an output is written made every command say
    '<folder>: cannot write there (File exists); choose an output folder you can write to', naming neither the
    file nor the fix. Now the one line names it and says to remove it; nothing is written."""
    model = graph_model([h.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, ["batch", 8])],
                        [("y", T.FLOAT, ["batch", 8])])
    onnx.save(model, tmp_path / "m.onnx")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".trtforge-staging").write_text("")
    assert_one_line_error(cli("fold", tmp_path / "m.onnx", "-o", out / "f.onnx"), 2, ".trtforge-staging",
                          "in the way", "remove it")
    (out / ".trtforge-staging").unlink()
    (out / ".trtforge-staging").symlink_to(tmp_path / "nowhere")
    assert_one_line_error(cli("fold", tmp_path / "m.onnx", "-o", out / "f.onnx"), 2, ".trtforge-staging",
                          "remove it")
    assert sorted(p.name for p in out.iterdir()) == [".trtforge-staging"]


def test_a_model_without_inputs_is_refused_before_the_build(cli, tmp_path: Path) -> None:
    """A model with no graph inputs (y = Constant) built, exit 0 ('0 optimization profiles; inputs )'), into an
    engine folder whose manifest triton and diff then refused as 'key inputs missing or empty; rebuild the engine
    with trtforge build', advice that loops. Now the build refuses it, exit 2, one line, nothing written."""
    pytest.importorskip("tensorrt_rtx")
    import numpy as np
    from onnx import numpy_helper as nh

    node = h.make_node("Constant", [], ["y"], value=nh.from_array(np.ones(3, np.float32)))
    onnx.save(graph_model([node], [], [("y", T.FLOAT, [3])]), tmp_path / "c.onnx")
    res = cli("build", tmp_path / "c.onnx", "--profile", "a10", "-o", tmp_path / "e", "--no-progress")
    assert_one_line_error(res, 2, "c.onnx", "no graph inputs")
    assert not (tmp_path / "e").exists()
