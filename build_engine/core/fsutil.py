"""Atomic file and directory writes: nothing half-written is ever left at the final path.

Write to a temporary sibling (same filesystem, so ``os.replace`` is atomic), fsync, then rename. On any error the
temporary is removed and the destination is untouched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import InputError


def _default_mode(base: int) -> int:
    """The mode a plain ``open()``/``mkdir()`` would give under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return base & ~umask


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
    """Yield a temporary path beside ``path``; on success rename it onto ``path``, on failure delete it."""
    dest = check_output_file(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent or ".")
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, _default_mode(0o666))  # mkstemp makes 0600; outputs are read by Triton and colleagues
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    from .jsonout import dumps

    write_text(path, dumps(obj, indent=2, sort_keys=False) + "\n")  # null, never NaN/Infinity


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` (only if ``force`` when it exists).

    The old folder, if any, is moved aside and deleted only after the new one is in place.
    """
    dest = Path(path)
    _check_parent(dest)
    if dest.exists() and not force:
        raise InputError(f"{dest} already exists; pass --force to replace it or choose another output folder")
    if dest.exists() and not dest.is_dir():
        raise InputError(f"{dest} exists and is not a folder; remove it or choose another output folder")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent or "."))
    os.chmod(tmp, _default_mode(0o777))  # mkdtemp makes 0700
    try:
        yield tmp
        old: Path | None = None
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent or "."))
            os.rmdir(old)
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
