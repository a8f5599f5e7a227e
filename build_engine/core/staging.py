"""Crash-safe commits: stage outside where consumers scan, then commit by one rename (or one exchange).

Every output is assembled in a private folder ``ROOT/.trtforge-staging/<label>.<pid>.<random>/`` on the same
filesystem as the output (``ROOT`` is the output's folder, or a Triton repository's parent, so that nothing
half-made ever sits inside a repository tritonserver scans or inside an engine folder). The owning process holds an
``flock`` on ``.lock`` inside it for its whole life, so a later run can tell a leftover of a killed run (lock free)
from a folder another run is still using (lock held), without guessing from pids or ages.

A folder output replaces an existing one with ``renameat2(RENAME_EXCHANGE)`` (Linux, glibc >= 2.28): old and new
swap in one step, then the old tree (now in the staging folder) is deleted. Where the filesystem or libc cannot
exchange, the swap is two renames with a record (``record.json``) written first; ``sweep`` (run by every writing
command and by ``trtforge triton --check``) completes it from the record after a kill: the output is never left
missing or mixed.

Test hook: ``TRTFORGE_TEST_KILL_AT=POINT[:SIGNAL]`` makes the process send itself SIGNAL (default SIGKILL) when it
reaches the commit step named POINT (see ``fault_point`` calls); ``TRTFORGE_TEST_NO_EXCHANGE=1`` forces the
two-rename swap. Both exist only for the interrupt tests (tests/reliability) and do nothing unless set.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

from . import env, interrupt
from .errors import InputError

STAGING = ".trtforge-staging"
KILL_AT_ENV = env.TEST_KILL_AT.name
NO_EXCHANGE_ENV = env.TEST_NO_EXCHANGE.name
RECORD = "record.json"
CLAIM = ".claim."  # in a data-name claim's file name (core/model_commit.py)
_LOCK = ".lock"
_log = logging.getLogger("trtforge.core.staging")


def fault_point(name: str) -> None:
    """Test hook (see module docstring): signal this process when ``TRTFORGE_TEST_KILL_AT`` names ``name``."""
    spec = env.get(env.TEST_KILL_AT)
    if not spec:
        return
    point, _, sig = spec.rpartition(":")
    if not sig.startswith("SIG"):  # no signal given: the whole spec is the point (points contain ':')
        point, sig = spec, ""
    if point == name:
        signum = getattr(signal, sig or "SIGKILL", None)
        if not isinstance(signum, signal.Signals):
            raise InputError(f"environment variable {env.TEST_KILL_AT.name}={spec!r}: {sig!r} is not a signal name; "
                             "give POINT or POINT:SIGNAL (e.g. SIGINT), or unset it")
        os.kill(os.getpid(), signum)


def default_mode(base: int) -> int:
    """The mode a plain ``open()``/``mkdir()`` would give under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return base & ~umask


def held(lock: Path) -> bool | None:
    """Whether a live process holds an ``flock`` on the file ``lock``; None when there is no such file."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return None
    except OSError:
        return True  # unreadable: not ours to remove
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the lock we may just have taken
    return False


def _locked_by_someone(entry: Path) -> bool:
    """Whether a live process holds ``entry``'s lock; an entry with no lock file yet is judged by its pid."""
    state = held(entry / _LOCK)
    return _pid_alive(entry.name) if state is None else state


# LABEL.PID.RANDOM, as ``staging_dir`` names its folders; anything else under .trtforge-staging (build-matrix's cell
# folders) belongs to another writer and is never touched here.
_ENTRY = re.compile(r".+\.([0-9]+)\.[A-Za-z0-9_]{8}")


def _pid_alive(name: str) -> bool:
    m = _ENTRY.fullmatch(name)
    pid = int(m.group(1)) if m else 0
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover(entry: Path) -> str | None:
    """Finish an interrupted two-rename swap recorded in ``entry``: if the output is missing, put back the new tree
    (complete, it was staged before the record was written) or else the old one. Returns what was done."""
    try:
        record = json.loads((entry / RECORD).read_text(encoding="utf-8"))
        dest = Path(record["dest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if os.path.lexists(dest):
        return None
    for part, what in (("new", "completed"), ("old", "rolled back")):
        if (entry / part).is_dir():
            os.rename(entry / part, dest)
            return f"{what} the interrupted replacement of {dest}"
    return None


def stale_entries(root: Path) -> list[Path]:
    """Staging folders under ``root/.trtforge-staging`` left by killed runs (no live process holds their lock)."""
    base = root / STAGING
    if not base.is_dir():
        return []
    return sorted(e for e in base.iterdir()
                  if e.is_dir() and _ENTRY.fullmatch(e.name) and not _locked_by_someone(e))


def sweep(root: Path) -> list[str]:
    """Recover and remove leftovers of killed runs under ``root``; returns one line per thing done."""
    done: list[str] = []
    for entry in stale_entries(root):
        action = recover(entry)
        if action:
            done.append(action)
        shutil.rmtree(entry, ignore_errors=True)
        done.append(f"removed {entry} (left by an interrupted run)")
    with contextlib.suppress(OSError):
        # model_commit's data-name claims and group_lock's files left by killed runs (a waiter that opened a lock
        # file removed here finds it gone after its flock and opens it anew)
        for claim in [*(root / STAGING).glob(f"*{CLAIM}*"), *(root / STAGING).glob("*.group")]:
            if claim.is_file() and held(claim) is False:
                claim.unlink(missing_ok=True)
    for line in done:
        _log.info("%s", line)
    with contextlib.suppress(OSError):
        (root / STAGING).rmdir()  # only when empty
    return done


def _new_entry(base: Path, label: str) -> Path:
    """``base/LABEL.PID.RANDOM``; ``base`` is made again when another run removed it (empty) in between: two runs
    writing into one folder at once had the second fail 'cannot write there (No such file or directory)'."""
    for _ in range(100):
        base.mkdir(exist_ok=True)
        try:
            entry = Path(tempfile.mkdtemp(prefix=f"{label[:80]}.{os.getpid()}.", dir=base))
        except FileNotFoundError:
            continue
        fault_point("staging:entry-made")
        return entry
    raise FileNotFoundError(errno.ENOENT, "another process keeps removing it", str(base))


def _locked_lock(entry: Path) -> int:
    """The entry's lock, held, before its name appears: a sweep that found ``.lock`` free between its creation and
    the ``flock`` deleted the folder of a live run. Until ``.lock`` exists a sweep judges the entry by its pid."""
    import fcntl

    tmp = entry / f"{_LOCK}.{os.getpid()}"
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    fault_point("staging:lock-opened")
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(tmp, entry / _LOCK)
    return fd


@contextlib.contextmanager
def staging_dir(root: Path, label: str, output: Path | None = None) -> Iterator[Path]:
    """A new private, locked folder in ``root/.trtforge-staging`` (leftovers swept first); removed on exit. A write
    in it that finds the disk or quota full is an InputError naming the output (default ``root/label``) and its
    filesystem, not an internal error."""
    from . import oserrors

    sweep(root)
    base = root / STAGING
    entry: Path | None = None
    fd: int | None = None
    try:
        with interrupt.deferred():  # made and recorded in one step, inside the try that removes them
            try:
                entry = _new_entry(base, label)
                fd = _locked_lock(entry)
            except OSError as exc:
                if os.path.lexists(base) and not base.is_dir():  # was 'cannot write there (File exists)'
                    raise InputError(f"{base} is in the way: trtforge stages its outputs in a folder by that name, "
                                     "and it is a file or a broken link; remove it") from exc
                raise InputError(f"{root}: cannot write there ({exc.strerror or exc}); choose an output folder you "
                                 "can write to") from exc
        try:
            yield entry
        except OSError as exc:
            if exc.errno in oserrors.DISK_FULL:
                raise oserrors.disk_full(output or root / label, entry, exc) from exc
            raise
    finally:
        with interrupt.deferred():  # a second Ctrl-C (or a SIGTERM after it) must not stop the clean-up half-way
            if entry is not None:
                shutil.rmtree(entry, ignore_errors=True)
            if fd is not None:
                os.close(fd)
            with contextlib.suppress(OSError):
                base.rmdir()


@contextlib.contextmanager
def group_lock(output: Path) -> Iterator[None]:
    """Hold an exclusive lock for writing the group of outputs keyed by ``output`` (a model and its report,
    ``diff --save``'s three files): a second run writing the same group waits, so the group ends all one run's.
    The lock file (``.trtforge-staging/<hash>.group``) is removed by its holder; one that a waiter locked after it
    was removed is not the lock any more, so the waiter opens it again."""
    import fcntl
    import hashlib

    parent = output.parent if str(output.parent) else Path(".")
    key = hashlib.sha256(os.fsencode(os.path.realpath(parent) + os.sep + output.name)).hexdigest()[:24]
    base = parent / STAGING
    lock = base / f"{key}.group"
    fd: int | None = None
    try:
        for _ in range(1000):
            base.mkdir(exist_ok=True)
            try:
                with interrupt.deferred():  # opened and recorded in one step, inside the try that removes it
                    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
                    fault_point("group:opened")
            except FileNotFoundError:  # base removed (empty) by another run in between
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)  # a wait a signal may end
            if _is_file_of(fd, lock):
                break
            with interrupt.deferred():
                os.close(fd)  # the holder removed that file as we waited: take the lock anew
                fd = None
        else:
            raise FileNotFoundError(errno.ENOENT, "another process keeps removing it", str(base))
        yield
    finally:
        with interrupt.deferred():  # as staging_dir's clean-up
            if fd is not None:
                _drop_group_lock(fd, lock)
            with contextlib.suppress(OSError):
                base.rmdir()  # only when empty


def _is_file_of(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is the file now at ``path``."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _drop_group_lock(fd: int, lock: Path) -> None:
    """Remove ``lock`` if ``fd`` holds it (or can take it at once: a run stopped before its ``flock`` returned, on a
    file no one else holds) and it is still the file at that path; then close ``fd``. A lock another run holds is
    left to that run."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass
    else:
        if _is_file_of(fd, lock):
            lock.unlink(missing_ok=True)
    os.close(fd)


_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _renameat2(a: Path, b: Path, flag: int) -> bool:
    """``renameat2(a, b, flag)``; False where the libc or filesystem lacks it (then the caller falls back)."""
    if env.get(env.TEST_NO_EXCHANGE):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False  # glibc < 2.28 or not Linux
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flag) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def _publish_new(new: Path, dest: Path) -> bool:
    """Rename ``new`` to ``dest`` unless ``dest`` exists (False then): ``RENAME_NOREPLACE`` where available, so a
    folder another run created meanwhile is neither replaced nor merged into (a plain rename replaces an empty one)."""
    try:
        if _renameat2(new, dest, _RENAME_NOREPLACE):
            return True
        if os.path.lexists(dest):
            return False
        os.rename(new, dest)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        return False
    return True


def commit_dir(new: Path, dest: Path, entry: Path, *, replace: bool = True) -> None:
    """Make the complete folder ``new`` (inside staging folder ``entry``) the folder ``dest``, in one step. Without
    ``replace`` a ``dest`` that exists by now (made by a concurrent run) is an InputError, never replaced."""
    if not replace or not os.path.lexists(dest):
        fault_point("dir:before-rename")
        if _publish_new(new, dest):
            fault_point("dir:renamed")
            return
    if not replace:  # made meanwhile by a concurrent run (the command checked it was absent before writing)
        raise InputError(f"{dest} was created by another run while this one was writing it; it was left as that "
                         "run wrote it and nothing was replaced; pass --force to replace it")
    (entry / RECORD).write_text(json.dumps({"dest": str(dest.absolute())}), encoding="utf-8")
    fault_point("dir:before-swap")
    if _exchange(new, dest):
        fault_point("dir:swapped")
        shutil.rmtree(new, ignore_errors=True)  # it holds the old tree now
        return
    os.rename(dest, entry / "old")
    fault_point("dir:between-renames")
    os.rename(new, dest)
    fault_point("dir:renamed")
    shutil.rmtree(entry / "old", ignore_errors=True)


def legacy_temporaries(folder: Path) -> list[Path]:
    """Hidden ``.NAME.*.tmp`` / ``.NAME.*.old`` leftovers of trtforge before 0.2 (no lock to tell whether a run
    still uses them, so they are reported with the command to remove them, never removed)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith((".tmp", ".old")))
