"""One cell's work, run inside a worker process (local pool or Ray task): pipeline, then ``build_engine``.

The worker never writes under OUTROOT's final paths. It builds into a private temporary folder and hands back either
the engine folder's files as bytes (through the executor: a pipe, or Ray's object store) or, with ``shared_fs``, a
staging folder on the shared filesystem that the driver renames into place. A deterministic failure (bad model,
TensorRT error) comes back as a result with ``ok=False``, never as an exception, so executors retry only crashes.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import env
from ..core.errors import InputError, TrtforgeError
from .spec import Pipeline

# Fault injection for the tests (a worker killed mid-build): when set to a folder, the first attempt of each cell
# creates a marker there and SIGKILLs its own process during the build; the retry finds the marker and proceeds.
KILL_ONCE_ENV = env.TEST_KILL_ONCE_DIR.name


@dataclass(frozen=True)
class CellJob:
    """Everything a worker needs; plain data so it pickles for processes and Ray."""

    label: str
    model_name: str  # file name the source is written as (keeps external-data references valid)
    source_path: str | None  # read in place (local executor, shared filesystem)
    source_files: dict[str, bytes] | None  # or the model and its external data as bytes (object store)
    pipeline: Pipeline
    profile: Any  # trtforge.profiles.loader.Profile
    backend: str  # tensorrt | tensorrt_rtx
    staging: str | None = None  # shared-filesystem folder to leave the engine in; None: return bytes
    source_display: str = ""  # the model's path as the driver knows it, named in a failure's reason
    # Folder to make the private work folder in (None: $TMPDIR). The local executor gives one under OUTROOT's
    # staging, which the driver removes: a worker it kills (SIGTERM/Ctrl-C of the run) cannot remove its own.
    work_root: str | None = None


@dataclass
class CellResult:
    ok: bool
    reason: str = ""
    refused: bool = False  # could not be placed (no node has its resource); not an attempt that failed
    attempts: int = 1
    files: dict[str, bytes] | None = None
    staged: str | None = None
    seconds: float = 0.0
    host: str = ""
    steps: list[str] = field(default_factory=list)


def _maybe_die(label: str) -> None:
    folder = env.get(env.TEST_KILL_ONCE_DIR)
    if not folder:
        return
    marker = Path(folder) / label.replace("/", "__")
    if marker.exists():
        return
    marker.write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)


def _source(job: CellJob, work: Path) -> Path:
    if job.source_files is None:
        assert job.source_path is not None
        return Path(job.source_path)
    src = work / "source"
    src.mkdir()
    for name, data in job.source_files.items():  # names relative to the model's folder ("data/w.bin" keeps its folder)
        target = (src / name).resolve()
        if not target.is_relative_to(src.resolve()):
            raise InputError(f"{job.label}: external data {name!r} lies outside the model's folder; keep external data "
                             "files in the model's folder or below it")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return src / job.model_name


def apply_pipeline(source: Path, pipeline: Pipeline, out: Path) -> tuple[Path, list[str]]:
    """Run fold / precision / LoRA inject on ``source``; returns the model to build and the steps done."""
    from ..core import onnx_io, onnx_save

    steps: list[str] = []
    if not pipeline.fold and pipeline.precision is None and pipeline.lora is None:
        return source, steps
    loaded = onnx_io.load(source)
    model = loaded.model
    if pipeline.fold:
        from ..passes import fold

        model = fold(model).model
        steps.append("fold")
    if pipeline.precision is not None:
        from ..precision.convert import convert_precision

        model = convert_precision(model, pipeline.precision).model
        steps.append(f"precision {pipeline.precision}")
    if pipeline.lora is not None:
        from trtforge.plugins.lora.inject import inject

        lo = pipeline.lora
        model = inject(model, list(lo.targets), lo.max_rank, lo.slots)
        steps.append(f"lora inject {','.join(lo.targets)} r{lo.max_rank} x{lo.slots}")
    onnx_save.save_like(model, out, loaded)  # external data stays external, in bodies too
    return out, steps


def _named(reason: str, job: CellJob, work: Path) -> str:
    """The reason with the worker's temporary files named as the model the matrix gave (a TensorRT parse error
    named /tmp/trtforge-cell-*/pipeline.onnx, deleted by then)."""
    if not job.source_display:
        return reason
    return (reason.replace(str(work / "pipeline.onnx"), f"{job.source_display} (after the matrix pipeline)")
            .replace(str(work / "source" / job.model_name), job.source_display))


def run_cell(job: CellJob) -> CellResult:
    """Build one cell; never raises for a TrtforgeError (returned as ``ok=False`` with the one-line reason)."""
    import socket

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="trtforge-cell-", dir=job.work_root))
    try:
        from ..engine.builder import build_engine

        src = _source(job, work)
        model, steps = apply_pipeline(src, job.pipeline, work / "pipeline.onnx")
        _maybe_die(job.label)
        engine = work / "engine"
        cli_backend = "tensorrt-rtx" if job.backend == "tensorrt_rtx" else "tensorrt"
        from ..engine.shapes import parse_dims

        build_engine(model, job.profile, engine, backend=cli_backend, progress=False,
                     dims=parse_dims(job.pipeline.dims, "dims"))
        result = CellResult(ok=True, seconds=time.perf_counter() - t0, host=socket.gethostname(), steps=steps)
        if job.staging is not None:
            # A rename when the temporary folder and OUTROOT share a filesystem, else a copy: os.replace failed with
            # EXDEV (every cell "internal error") when OUTROOT was not on $TMPDIR's filesystem. The staging folder
            # is not final (the driver publishes it by a rename inside OUTROOT); a copy cut short is removed by the
            # next run. A retry gets its first attempt's folder: what a killed attempt left there goes first
            # (shutil.move put the engine inside it, and the driver published the cut-short copy).
            shutil.rmtree(job.staging, ignore_errors=True)
            shutil.move(engine, job.staging)
            result.staged = job.staging
        else:
            result.files = {f.name: f.read_bytes() for f in sorted(engine.iterdir()) if f.is_file()}
        return result
    except TrtforgeError as exc:
        return CellResult(ok=False, reason=_named(exc.message, job, work), seconds=time.perf_counter() - t0)
    except Exception as exc:  # a bug, not a crash of the worker: deterministic, so not retried
        text = " ".join(str(exc).split())[:300]
        return CellResult(ok=False, reason=f"internal error: {type(exc).__name__}: {text}",
                          seconds=time.perf_counter() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
