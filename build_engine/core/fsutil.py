"""Atomic file and directory writes: nothing half-written is ever left at the final path.

Outputs are staged in a private folder under ``.trtforge-staging`` beside the output (same filesystem; see
``staging``), never beside the output under a name a consumer might scan, then committed by one rename (a file) or
one exchange (a folder replacing an existing one). On any error or interrupt the staging folder is removed and the
destination is untouched; after a kill -9 the next writing run removes it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import interrupt, pairing, staging
from .errors import InputError


def _check_parent(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise InputError(f"{path}: folder {parent} does not exist; create it first or choose another output path")
    if not parent.is_dir():
        raise InputError(f"{path}: {parent} is not a folder; choose another output path")


def check_output_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if a file can be written there (its folder exists, it is not a folder); else InputError.

    A command that writes several files checks every path before writing the first, so that a bad later path
    does not leave the earlier files behind.
    """
    dest = Path(path)
    _check_parent(dest)
    from .paths import refuse_special

    refuse_special("output", dest)  # a device or FIFO is never replaced by a regular file
    if dest.is_dir():
        raise InputError(f"{dest} is a folder; give a file path for the output")
    return dest


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path (in ``.trtforge-staging`` beside ``path``); on success rename it onto ``path``, on
    failure delete it. Blocks nested in one another are one group (``pairing.group_member``): once the inner output
    is in place the outer ones are committed even when a signal ends their blocks, so every output of a group is
    written in full before the innermost block ends."""
    dest = check_output_file(path)
    parent = dest.parent if str(dest.parent) else Path(".")
    with staging.staging_dir(parent, dest.name) as entry, pairing.group_member() as member:
        tmp = entry / dest.name
        tmp.touch(mode=0o666)  # mode from the umask, as a plain open() gives: outputs are read by Triton and colleagues
        try:
            yield tmp
        except BaseException:
            if not member.begun:
                raise
            _commit(tmp, dest, stoppable=False)  # an output nested in this block is in place: so goes this one
            raise
        staging.fault_point("file:block-done")
        _commit(tmp, dest, stoppable=not member.begun)


def _commit(tmp: Path, dest: Path, *, stoppable: bool) -> None:
    """fsync and rename ``tmp`` onto ``dest``; ``stoppable``: a signal received during the write commits nothing
    (not so once another output of its group is in place, ``pairing.group_member``)."""
    with contextlib.nullcontext() if stoppable else interrupt.deferred():
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        staging.fault_point("file:staged")
        if stoppable:
            interrupt.check()  # a signal during the write: commit nothing
        with interrupt.deferred():
            staging.fault_point("file:before-rename")
            os.replace(tmp, dest)
            pairing.committed()
            staging.fault_point("file:renamed")


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    from .jsonout import dumps

    write_text(path, dumps(obj, indent=2, sort_keys=False) + "\n")  # "inf" / "nan", never NaN/Infinity


@contextlib.contextmanager
def staged_json(path: str | os.PathLike[str] | None, obj: Any,
                describes: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Write ``obj`` as JSON (a report beside a command's main output) into ``path``'s staging now, and rename it
    into place when the block, which writes the other output, ends without error: a write that fails (a full disk)
    leaves neither, where writing one after the other left the model without its report. ``None``: no report.

    Another run writing the same report meanwhile waits (``staging.group_lock``): two runs interleaving their
    renames left one run's model beside the other's report.

    ``describes``: the model file the report is about. Just before that model's commit (``model_commit``) the
    report is rewritten with ``output_sha256`` (the sha256 of the model file's bytes as committed) and
    ``output_bytes``. The two renames are separate steps, so a ``kill -9`` between them leaves the new model beside
    the old report; the sha256 tells a reader so (``core.pairing.report_matches``)."""
    if path is None:
        yield
        return
    from .jsonout import dumps

    def write(extra: dict[str, Any]) -> None:
        tmp.write_bytes((dumps({**obj, **extra}, indent=2, sort_keys=False) + "\n").encode("utf-8"))

    with staging.group_lock(check_output_file(path)), atomic_path(path) as tmp:
        write({})
        with pairing.sealed_by(describes, lambda staged: write(pairing.file_identity(staged))):
            yield


def check_output_folder(path: str | os.PathLike[str], label: str | None = None) -> None:
    """An output folder replaced as a whole must be one a rename can replace: not ``.`` / ``..`` (renaming a name
    the kernel resolves that way is EBUSY / EINVAL) and not a mount point (EBUSY): both were exit 3 after the whole
    build, and ``--force`` cannot help. InputError naming the fix."""
    dest = Path(path)
    what = f"{label} {path}" if label else str(path)
    if dest.name in ("", ".", ".."):
        raise InputError(f"{what}: names the folder as '.' or '..', which cannot be replaced as a whole; give the "
                         "output folder a name of its own (e.g. -o engine)")
    if os.path.ismount(dest):
        raise InputError(f"{what} is a mount point, which cannot be replaced as a whole; give a folder inside it "
                         f"(e.g. {os.path.join(path, 'engine')})")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], *, force: bool = False,
               staging_root: str | os.PathLike[str] | None = None) -> Iterator[Path]:
    """Yield a new empty folder (staged in ``STAGING_ROOT/.trtforge-staging``, default: ``path``'s folder); on success
    it becomes ``path`` in one step (only with ``force`` when ``path`` exists: then old and new are exchanged and the
    old tree deleted). ``staging_root`` must be on ``path``'s filesystem and is where no consumer scans (a Triton
    repository's parent, not the repository)."""
    dest = Path(path)
    check_output_folder(dest)
    _check_parent(dest)
    parent = dest.parent if str(dest.parent) else Path(".")
    root = Path(staging_root) if staging_root is not None else parent
    staging.sweep(root)  # first: an interrupted swap puts ``dest`` back, and then it needs ``force`` like any other
    if os.path.lexists(dest) and not force:
        raise InputError(f"{dest} already exists; pass --force to replace it or choose another output folder")
    if os.path.lexists(dest) and not dest.is_dir():
        raise InputError(f"{dest} exists and is not a folder; remove it or choose another output folder")
    if os.stat(root).st_dev != os.stat(parent).st_dev:
        root = parent  # a rename cannot cross filesystems (e.g. a repository that is a mount point)
    with staging.staging_dir(root, dest.name, dest) as entry:
        tmp = entry / "new"
        tmp.mkdir(mode=0o777)  # mode from the umask, as a plain mkdir() gives
        yield tmp
        staging.fault_point("dir:staged")
        interrupt.check()
        with interrupt.deferred():
            staging.commit_dir(tmp, dest, entry, replace=force)
