"""The build-matrix driver: plan, skip what is cached, run the rest, commit each engine atomically, report.

Workers produce; only the driver writes under OUTROOT, and each cell's folder ``OUTROOT/<model>/<profile>/`` is
published by one rename (old folder moved aside first), so a kill at any instant leaves every cell folder all-old or
all-new. ``cell.json`` in the folder records the cache key and the sha256 of every other file in it; a rerun (after
a crash of the driver or a worker too) skips every cell whose folder holds the same key and exactly those files.
``OUTROOT/matrix.json`` lists every cell with its status: built, cached, failed (with the reason) or refused, and
``counts`` per status; a dry run (not written) adds planned, in ``counts`` too, so they add up to the cells. Runs
that write one OUTROOT are serialized by a lock file in it (``run_matrix``), so concurrent runs never delete each
other's staged builds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import fsutil, interrupt, staging
from ..core.errors import InputError, TrtforgeError
from ..engine.manifest import Manifest
from .cells import Cell, check_sources, describe, plan_cells, profile_file, trtforge_version
from .executors import Submission, run_local, run_on_ray
from .spec import MatrixSpec
from .worker import CellJob, CellResult

CELL_FILE = "cell.json"
REPORT_FILE = "matrix.json"
# Its own name: core.staging's .trtforge-staging under OUTROOT may hold another live process's output.
STAGING = ".trtforge-matrix-staging"
_log = logging.getLogger("trtforge.build_engine.matrix")


@dataclass
class CellStatus:
    cell: Cell
    status: str = "pending"  # pending | running | built | cached | failed | refused | planned
    reason: str = ""
    seconds: float = 0.0
    attempts: int = 0
    plan_bytes: int = 0
    outdir: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**describe(self.cell), "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 3), "attempts": self.attempts, "plan_bytes": self.plan_bytes,
                "outdir": self.outdir}


@dataclass
class MatrixReport:
    source: str
    executor: str
    cells: list[CellStatus] = field(default_factory=list)
    seconds: float = 0.0
    dry_run: bool = False  # its counts then hold "planned" too (the cells a run would build), so they add up

    def count(self, status: str) -> int:
        return sum(1 for c in self.cells if c.status == status)

    @property
    def ok(self) -> bool:
        return all(c.status in ("built", "cached", "planned") for c in self.cells)

    def to_json(self) -> dict[str, Any]:
        counts = {s: self.count(s) for s in ("built", "cached", "failed", "refused", *("planned",) * self.dry_run)}
        return {"format": 1, "matrix": self.source, "executor": self.executor, "seconds": round(self.seconds, 3),
                "trtforge": trtforge_version(), "counts": counts, "cells": [c.to_json() for c in self.cells]}


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file in a cell folder but its cell.json, by path relative to the folder."""
    return {p.relative_to(folder).as_posix(): _sha256_file(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p != folder / CELL_FILE}


def is_cached(cell: Cell, outdir: Path) -> bool:
    """The folder holds a finished build with this cell's key: exactly the files its cell.json lists, each with the
    bytes it recorded (a plan matching its own manifest was not enough: another cell's engine and manifest copied
    in, an edited manifest or a removed model.onnx were served as cached), and a manifest that loads."""
    try:
        recorded = json.loads((outdir / CELL_FILE).read_text())
        files = recorded.get("files")
        if recorded.get("key") != cell.key or not isinstance(files, dict):
            return False
        present = sorted(p.relative_to(outdir).as_posix() for p in outdir.rglob("*")
                         if p.is_file() and p != outdir / CELL_FILE)
        if present != sorted(files):  # cheap first: no hashing when a file is missing or extra
            return False
        Manifest.load(outdir)
        return file_digests(outdir) == files
    except (OSError, ValueError, AttributeError, InputError):
        return False


def check_outroot(spec: MatrixSpec, outroot: Path) -> Path:
    """OUTROOT resolved; refused when it is (or holds) an input or is not a folder we may create."""
    from ..core import paths

    root = outroot.resolve()
    # OUTROOT's cell folders are replaced as wholes: OUTROOT itself must hold no input (the one rule, core.paths).
    from .triton_assembly import entry_name

    # A .toml profile is an input too, and names its cells (OUTROOT/<model>/<profile name>, REPO/<model>_<name>)
    # by the profile's `name`, not by its file name.
    tomls = {ref: path for m in spec.models for ref in m.profiles if (path := profile_file(spec, ref)) is not None}
    names = {ref: _profile_name(ref, path) for ref, path in tomls.items()}
    _check_cell_folders(spec, names)
    # [triton] entries REPO/<model>_<profile> are replaced (force) too: none may hold an input either.
    entries = [] if spec.triton_repo is None else [
        (f"[triton] repo entry {e}", spec.triton_repo / e)
        for e in (entry_name(m.name, names.get(p, p)) for m in spec.models for p in m.profiles)]
    if spec.triton_repo is not None:
        _check_entry_names(spec, names)
    paths.check(inputs=[("MATRIX.toml", spec.source), *((f"model {m.name}", m.path) for m in spec.models),
                        *((f"profile {ref}", path) for ref, path in tomls.items())],
                folders=[("-o", outroot), *entries])
    if root.exists() and not root.is_dir():
        raise InputError(f"{outroot} exists and is not a folder; choose another output folder")
    for m in spec.models:  # a file where a cell folder goes: deleted by the publish (at OUTROOT/<model>/<profile>),
        # or the run ended after building with "internal error: FileExistsError" (at OUTROOT/<model>)
        for path in (root / m.name, *(root / m.name / names.get(p, p) for p in m.profiles)):
            if os.path.lexists(path) and not path.is_dir():
                raise InputError(f"{path} exists and is not a folder (build-matrix writes a cell folder there); "
                                 "move it away or choose another output folder")
    if spec.triton_repo is not None and (spec.triton_repo == root or root in spec.triton_repo.parents):
        raise InputError(f"the Triton repository {spec.triton_repo} must not be inside the output folder {outroot}")
    return root


def _check_cell_folders(spec: MatrixSpec, names: dict[str, str]) -> None:
    """Each cell gets a folder of its own, inside OUTROOT: a .toml profile's ``name`` is one plain path component
    (``name = "../../x"`` published the engine over a folder outside OUTROOT, deleting what it held), and no two
    profiles of a model share a name (their engines took turns overwriting one folder, each reported built)."""
    from .cells import folder_name_problem

    for ref, name in names.items():
        problem = folder_name_problem(name)
        if problem:
            raise InputError(f"{spec.source}: profile {ref}: {problem}")
    for m in spec.models:
        if m.name == REPORT_FILE:  # OUTROOT/matrix.json would be a cell folder: the report then failed, exit 2
            raise InputError(f"{spec.source}: model name {m.name!r} is OUTROOT's report file; give the model "
                             "another name")
        seen: dict[str, str] = {}
        for ref in m.profiles:
            name = names.get(ref, ref)
            if name in seen:
                raise InputError(f"{spec.source}: model {m.name!r}: profiles {seen[name]!r} and {ref!r} are both "
                                 f"named {name!r}, so both engines would be OUTROOT/{m.name}/{name}; list the "
                                 "profile once or give the .toml profile another name")
            seen[name] = ref


def _check_entry_names(spec: MatrixSpec, names: dict[str, str]) -> None:
    """Two cells may not share a [triton] entry ``<model>_<profile>`` (model ``m_a10`` x profile ``a100`` and model
    ``m`` x a profile named ``a10_a100``): the second entry replaced the first, both cells reported built."""
    from .triton_assembly import entry_name

    seen: dict[str, str] = {}
    for m in spec.models:
        for ref in m.profiles:
            cell = f"{m.name}/{names.get(ref, ref)}"
            entry = entry_name(m.name, names.get(ref, ref))
            if entry in seen:
                raise InputError(f"{spec.source}: cells {seen[entry]} and {cell} would both be the [triton] repo "
                                 f"entry {entry!r} (<model>_<profile>); rename one of the models or profiles")
            seen[entry] = cell


def _profile_name(ref: str, path: Path) -> str:
    """The name a .toml profile's cells get (its ``name``), or its file stem when it does not load (its cells are
    then refused, and write nothing)."""
    from trtforge.profiles.loader import load_profile

    try:
        return load_profile(str(path.resolve())).name
    except TrtforgeError:
        return Path(ref).stem


def _refuse_unplaceable(cells: list[CellStatus]) -> None:
    """The local executor builds only what this machine can: the resources it would advertise to a cluster."""
    from .cells import node_resources

    have = node_resources()
    for st in cells:
        if st.status in ("pending", "planned") and have.get(st.cell.resource, 0) < 1:
            st.status = "refused"
            st.reason = (f"this machine cannot build it (needs resource {st.cell.resource!r}: "
                         + ("TensorRT-RTX is not installed" if st.cell.resource == "trtforge_rtx" else
                            "full TensorRT and a GPU of that compute capability")
                         + "); run it with --executor ray on a cluster that has such a node")


def _clean_staging(root: Path, models: list[str]) -> None:
    """Leftovers of a killed run: the staging folder, and atomic_dir temporaries in this matrix's OUTROOT/<model>/
    folders only (OUTROOT/*/.*.tmp and .*.old removed a user's hidden folders anywhere in an OUTROOT holding more)."""
    shutil.rmtree(root / STAGING, ignore_errors=True)
    for leftover in (p for name in models for pattern in (".*.tmp", ".*.old") for p in (root / name).glob(pattern)):
        shutil.rmtree(leftover, ignore_errors=True)


def _publish(staged: Path, dest: Path) -> None:
    """Make ``staged`` the folder ``dest`` in one step (an existing one is exchanged with it, then deleted; see
    ``core.staging``: a kill leaves the old or the new cell, never none)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with staging.staging_dir(dest.parent, dest.name) as entry:
        os.rename(staged, entry / "new")  # both under OUTROOT: same filesystem
        # A signal waits for the commit (without renameat2 a Ctrl-C between its renames lost the cell folder).
        with interrupt.deferred():
            staging.commit_dir(entry / "new", dest, entry)


def _cell_record(st: CellStatus, result: CellResult, files: dict[str, str]) -> dict[str, Any]:
    c = st.cell
    return {"key": c.key, **describe(c), "pipeline": c.model.pipeline.to_json(), "steps": result.steps,
            "seconds": round(result.seconds, 3), "host": result.host, "trtforge": trtforge_version(), "files": files}


def commit(root: Path, st: CellStatus, result: CellResult) -> None:
    """Write the cell's engine folder as one unit (see module docstring)."""
    dest = st.cell.outdir(root)
    if result.staged is not None:
        staged = Path(result.staged)
    else:
        staged = root / STAGING / uuid.uuid4().hex
        staged.mkdir(parents=True)
        for name, data in (result.files or {}).items():
            (staged / name).write_bytes(data)
        result.files = None  # on disk now: the driver held every cell's engine bytes until the run ended
    (staged / CELL_FILE).write_text(json.dumps(_cell_record(st, result, file_digests(staged)), indent=2) + "\n")
    _publish(staged, dest)
    st.plan_bytes = (dest / "model.plan").stat().st_size
    st.outdir = str(dest)


def _sources(spec: MatrixSpec, need: list[CellStatus], executor: str) -> dict[str, dict[str, bytes] | None]:
    """Model bytes for the object store (Ray without a shared filesystem); None: workers read the path."""
    from .cells import external_files

    out: dict[str, dict[str, bytes] | None] = {}
    for st in need:
        m = st.cell.model
        if m.name in out:
            continue
        if executor != "ray" or spec.shared_fs:
            out[m.name] = None
        else:
            # keyed by the path relative to the model's folder, as the model names its external data
            out[m.name] = {os.path.relpath(f, m.path.parent): f.read_bytes() for f in [m.path, *external_files(m.path)]}
    return out


def _submissions(spec: MatrixSpec, root: Path, need: list[CellStatus], sources: dict[str, Any],
                 executor: str) -> list[Submission]:
    subs = []
    staging_shared = executor == "local" or spec.shared_fs
    for i, st in enumerate(need):
        c = st.cell
        staging = str(root / STAGING / uuid.uuid4().hex) if staging_shared else None
        job = CellJob(label=c.label, model_name=c.model.path.name,
                      source_path=None if sources[c.model.name] is not None else str(c.model.path),
                      source_files=None, pipeline=c.model.pipeline, profile=c.profile, backend=c.backend,
                      staging=staging, source_display=str(c.model.path),
                      work_root=str(root / STAGING) if executor == "local" else None)
        subs.append(Submission(index=i, job=job, resource=c.resource, source_key=c.model.name))
    if staging_shared:
        (root / STAGING).mkdir(parents=True, exist_ok=True)
    return subs


def run_matrix(spec: MatrixSpec, outroot: Path, *, executor: str = "local", address: str = "local", jobs: int = 2,
               retries: int = 2, dry_run: bool = False, progress: Any = None) -> MatrixReport:
    """Plan, build what is not cached, commit, write matrix.json; returns the report (see module docstring).

    A run that writes holds an exclusive ``flock`` on ``OUTROOT/.trtforge-matrix.lock`` from planning to its last
    write, so two runs on one OUTROOT take turns (the second waits, then finds the first's cells cached) instead of
    deleting each other's staged builds; a dry run reads only and takes no lock."""
    t0 = time.perf_counter()
    root = check_outroot(spec, outroot)
    check_sources(spec)  # before OUTROOT is made: a missing external-data file is the model's, not a crash
    if dry_run:
        report = _plan(spec, root, executor, dry_run=True)
        report.seconds = time.perf_counter() - t0
        return report
    if executor == "ray":
        from .executors import check_address

        check_address(address)  # before anything is written: an unreachable head made ray.init wait for minutes
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root):
        report = _plan(spec, root, executor, dry_run=False)
        need = [st for st in report.cells if st.status == "pending"]
        _clean_staging(root, [m.name for m in spec.models])
        try:
            if need:
                _execute(spec, root, need, executor, address, jobs, retries, progress)
        finally:  # also on Ctrl-C / SIGTERM ("no partial output was left"): the workers are gone by now
            shutil.rmtree(root / STAGING, ignore_errors=True)
        try:
            if spec.triton_repo is not None:
                from .triton_assembly import assemble

                assemble(report.cells, spec.triton_repo)  # first: a cell it skips gets its reason in matrix.json too
        finally:
            report.seconds = time.perf_counter() - t0
            fsutil.write_json(root / REPORT_FILE, report.to_json())
    return report


LOCK_FILE = ".trtforge-matrix.lock"


@contextlib.contextmanager
def _exclusive(root: Path) -> Iterator[None]:
    """Hold OUTROOT's run lock (waits while another run holds it; the kernel drops it when a holder dies)."""
    import fcntl

    fd = os.open(root / LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o666)  # the umask decides, as for the outputs (umask 002:
    # a group sharing OUTROOT; 0o644 locked the other members out with 'permission denied')
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log.warning("another build-matrix run is writing %s; waiting for it to finish", root)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _plan(spec: MatrixSpec, root: Path, executor: str, dry_run: bool) -> MatrixReport:
    report = MatrixReport(source=str(spec.source), executor=executor, dry_run=dry_run)
    report.cells = [CellStatus(c) for c in plan_cells(spec)]
    for st in report.cells:
        if st.cell.refusal:
            st.status, st.reason = "refused", st.cell.refusal
        elif is_cached(st.cell, st.cell.outdir(root)):
            st.status, st.outdir = "cached", str(st.cell.outdir(root))
            st.plan_bytes = (st.cell.outdir(root) / "model.plan").stat().st_size
        elif dry_run:
            st.status = "planned"
    if executor == "local":
        _refuse_unplaceable(report.cells)
    return report


def _execute(spec: MatrixSpec, root: Path, need: list[CellStatus], executor: str, address: str, jobs: int,
             retries: int, progress: Any) -> None:
    sources = _sources(spec, need, executor)
    subs = _submissions(spec, root, need, sources, executor)

    def on_event(index: int, state: str, attempt: int, result: CellResult | None) -> None:
        st = need[index]
        st.attempts = attempt
        if state in ("running", "retry"):
            st.status = state
        elif result is not None:  # done: commit now, so a crash of the driver later keeps this cell
            _finish(root, st, result)
        if progress is not None:
            progress(st)

    if executor == "ray":
        lost = run_on_ray(subs, sources, address, jobs, retries, on_event)  # the cluster went away: why, or None
        for st in need if lost else ():
            if st.status in ("pending", "running", "retry"):  # the finished cells stay as they are
                st.status, st.reason = "failed", lost or ""
                if progress is not None:
                    progress(st)
    else:
        run_local(subs, jobs, retries, on_event)


def _finish(root: Path, st: CellStatus, res: CellResult) -> None:
    st.seconds, st.attempts = res.seconds, res.attempts
    if res.ok:
        commit(root, st, res)
        st.status = "built"
    else:
        st.status, st.reason = ("refused" if res.refused else "failed"), res.reason
