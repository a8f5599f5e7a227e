"""build-matrix across filesystems (held-out QA): a worker builds in $TMPDIR and hands the engine folder to OUTROOT's
staging; with OUTROOT on another filesystem that was an os.replace across devices (EXDEV), so every cell of the
default local executor failed with "internal error: OSError: [Errno 18] Invalid cross-device link". A real
TensorRT-RTX build of a one-MatMul model."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.matrix.driver import run_matrix
from trtforge.build_engine.matrix.spec import load_matrix

pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds the engines (pip install 'trtforge[rtx]')")


def _other_filesystem(than: Path) -> Path | None:
    """A writable folder on another filesystem than ``than`` (Linux: /dev/shm is a tmpfs), or None."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or os.stat(shm).st_dev == os.stat(than).st_dev:
        return None
    return Path(tempfile.mkdtemp(prefix="trtforge-qa-", dir=shm))


def _write_matrix(tmp_path: Path, rng: np.random.Generator) -> None:
    """``tmp_path/m.onnx`` (one MatMul, dynamic batch and sequence) and ``tmp_path/mx.toml`` building it for a100."""
    w = rng.standard_normal((32, 16)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 16])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "m.onnx"\nname = "m"\n')


def test_outroot_on_another_filesystem_than_tmpdir(tmp_path: Path, rng: np.random.Generator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    other = _other_filesystem(tmp_path)
    if other is None:
        pytest.skip("no second writable filesystem (/dev/shm) to put $TMPDIR on")
    try:
        monkeypatch.setenv("TMPDIR", str(other))  # the spawned workers build there; OUTROOT is under tmp_path
        _write_matrix(tmp_path, rng)
        report = run_matrix(load_matrix(tmp_path / "mx.toml"), tmp_path / "out", jobs=1)
        assert [(c.status, c.reason) for c in report.cells] == [("built", "")]
        manifest = json.loads((tmp_path / "out" / "m" / "a100" / "manifest.json").read_text())
        assert manifest["profile"] == "a100" and (tmp_path / "out" / "m" / "a100" / "model.plan").stat().st_size > 0
        assert not list(other.iterdir())  # the worker's temporary folder is gone
    finally:
        import shutil

        shutil.rmtree(other, ignore_errors=True)


def test_interrupted_run_leaves_no_staging(tmp_path: Path, rng: np.random.Generator) -> None:
    """Ctrl-C (or SIGTERM) while a cell builds: the CLI says "no partial output was left", but OUTROOT kept its
    .trtforge-matrix-staging folder until the next run."""
    from trtforge.build_engine.matrix.driver import STAGING

    _write_matrix(tmp_path, rng)

    def interrupt(st: object) -> None:  # the user presses Ctrl-C as the build starts
        if getattr(st, "status", "") == "running":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_matrix(load_matrix(tmp_path / "mx.toml"), tmp_path / "out", jobs=1, progress=interrupt)
    assert not (tmp_path / "out" / STAGING).exists() and not (tmp_path / "out" / "m").exists()


def test_retry_replaces_a_staging_folder_its_killed_attempt_left(tmp_path: Path, rng: np.random.Generator) -> None:
    """A retried cell gets the same staging folder as its first attempt. A worker killed after (or while) handing
    its engine over (a copy when $TMPDIR is another filesystem) left that folder, and the retry's shutil.move put
    the new engine *inside* it (staging/engine/...): the driver published the first attempt's cut-short plan."""
    import hashlib

    from trtforge.build_engine.matrix.spec import Pipeline
    from trtforge.build_engine.matrix.worker import CellJob, run_cell
    from trtforge.profiles.loader import load_profile

    _write_matrix(tmp_path, rng)
    staging = tmp_path / "out" / ".trtforge-matrix-staging" / "cell"
    staging.mkdir(parents=True)
    (staging / "model.plan").write_bytes(b"\0" * 100)  # the killed attempt's copy, cut short
    job = CellJob(label="m/a100", model_name="m.onnx", source_path=str(tmp_path / "m.onnx"), source_files=None,
                  pipeline=Pipeline(), profile=load_profile("a100"), backend="tensorrt_rtx", staging=str(staging))
    result = run_cell(job)
    assert result.ok and result.staged == str(staging), result.reason
    assert sorted(p.name for p in staging.iterdir()) == ["manifest.json", "model.onnx", "model.plan"]
    manifest = json.loads((staging / "manifest.json").read_text())
    assert hashlib.sha256((staging / "model.plan").read_bytes()).hexdigest() == manifest["plan_sha256"]
