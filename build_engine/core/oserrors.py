"""Operating-system errors that are the machine's state, not a bug: one line naming the path and what to do.

A full disk or quota (ENOSPC, EDQUOT, EFBIG), a read-only filesystem (EROFS), a denied permission (EACCES, EPERM),
a name over the filesystem's limit (ENAMETOOLONG: 255 bytes a name, 4095 a path on Linux), a current folder
deleted under the process, too many open files: each is bad input or environment (exit 2), never an internal
error (exit 3, "a bug: report it"). ``describe`` gives the line, or None for an error that may well be a bug
(then the CLI reports it as internal). ``disk_full`` names the output whose filesystem is full, since a failed
``write()`` carries no file name.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .errors import InputError

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

_FIXES: dict[int, str] = {
    errno.EROFS: "the filesystem is read-only; choose a path on a writable filesystem",
    errno.EACCES: "permission denied; choose a path you may use or change its permissions",
    errno.EPERM: "operation not permitted; choose a path you may use or change its permissions",
    errno.ENAMETOOLONG: "a file name over 255 bytes or a path over 4095 bytes; choose a shorter path",
    errno.ELOOP: "too many levels of symbolic links; fix the link or give the real path",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) and run it again",
    errno.ENFILE: "too many open files on the system; close some programs and run it again",
    errno.EIO: "the device reported an I/O error; check the disk (dmesg) or choose another one",
    errno.EBUSY: "device or resource busy (a mount point, or a file another program holds); choose another path",
}


def _free(folder: Path) -> str:
    try:
        st = os.statvfs(folder)
    except OSError:
        return ""
    return f", {st.f_bavail * st.f_frsize:,} bytes free there"


def disk_full(output: Path, staged: Path, exc: OSError) -> InputError:
    """The error for a write of ``output`` (staged in ``staged``, on its filesystem) that ran out of space or quota.
    A file the error names outside ``staged`` (a temporary file elsewhere) is the full one; else the output's."""
    named = [Path(os.path.abspath(os.fsdecode(n))) for n in (exc.filename2, exc.filename)
             if isinstance(n, str | bytes)]
    elsewhere = [n for n in named if Path(os.path.abspath(staged)) not in n.parents]
    where = elsewhere[0] if named and len(elsewhere) == len(named) else output
    folder = where.parent if str(where.parent) else Path(".")
    what = "file too large for the filesystem" if exc.errno == errno.EFBIG else (exc.strerror or "no space left")
    return InputError(f"{output}: cannot write it: {what.lower()} (filesystem of {os.path.abspath(folder)}"
                      f"{_free(folder)}); free space there (or raise the quota) or choose an output folder on another "
                      "disk")


def _cwd_gone() -> bool:
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def describe(exc: OSError) -> str | None:
    """One line for an OSError caused by the machine's state (see module docstring); None when it may be a bug."""
    names = " -> ".join(str(n) for n in (exc.filename, exc.filename2) if n is not None)
    if exc.errno == errno.ENOENT and _cwd_gone():
        return ("the current folder was deleted while trtforge ran in it; cd to an existing folder (or give "
                "absolute paths) and run it again")
    if exc.errno in DISK_FULL:
        place = names or "a file (an output, stdout redirected to a file, or a temporary file under $TMPDIR)"
        what = (exc.strerror or "no space left on device").lower()
        return f"{place}: {what}; free space there or choose another disk"
    fix = _FIXES.get(exc.errno or 0)
    if fix is None:
        return None
    return f"{names or 'a file'}: {fix}"
