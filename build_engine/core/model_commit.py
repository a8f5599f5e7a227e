"""Committing a saved ONNX model and its external data: the model file's rename is the single commit point.

A model with external data is two files. Renaming the data file onto the old one and then the model file would,
after a kill between the two renames, pair the old model with the new weights. So the new data file gets a name
the old model does not use (``NAME.data`` when that is free, else ``NAME.<8 hex>.data``), is renamed in first (the
old model still reads its own data file), and only the model's rename publishes the new pair. Afterwards the data
files of the ``NAME.data`` / ``NAME.<hex>.data`` family other than the new one (the old model's, or an orphan of a
killed run) are removed: those names belong to output ``NAME``.

Two runs saving one output at once would both pick ``NAME.data`` (free when each looked) and the second's data
rename would land under the first's published model (a kill in between, or the renames interleaved, left a model
with the other run's weights). So a run claims its data name (``claim_data_name``: a file in the folder's
``.trtforge-staging`` whose ``flock`` it holds until its commit is done), a name another live run claims is never
chosen, and the clean-up after a commit leaves such a name alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

from . import interrupt, pairing, staging
from .errors import InputError

_CLAIM = staging.CLAIM


def _held(claim: Path) -> bool:
    """Whether a live run holds ``claim``'s lock (a free one is a killed run's: removed here)."""
    state = staging.held(claim)
    if state is False:
        claim.unlink(missing_ok=True)
    return bool(state)


def _key(data_name: str) -> str:
    """A claim's name part for ``data_name``: bounded (a 250-byte model name leaves no room to add to it)."""
    import hashlib

    return hashlib.sha256(os.fsencode(data_name)).hexdigest()[:24]


def claimed_by_other(folder: Path, data_name: str, mine: Path | None = None) -> bool:
    """Whether a live run other than the holder of ``mine`` claims ``data_name`` in ``folder``."""
    base = folder / staging.STAGING
    try:
        names = os.listdir(base)
    except OSError:
        return False
    return any(base / n != mine and _held(base / n) for n in names if n.startswith(_key(data_name) + _CLAIM))


def _claim(base: Path, data_name: str, claims: list[tuple[Path, int]]) -> Path:
    """A claim file for ``data_name``, locked before its name appears (so a free visible claim is a dead run's),
    appended to ``claims`` in the same step as it is made (call inside ``interrupt.deferred()``)."""
    import fcntl

    key = _key(data_name)
    for _ in range(100):
        base.mkdir(exist_ok=True)  # again if another run removed it (empty) in between
        tag = f"{os.getpid()}.{secrets.token_hex(4)}"
        tmp, claim = base / f".{key}.{tag}", base / f"{key}{_CLAIM}{tag}"
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except FileNotFoundError:
            continue
        claims.append((tmp, fd))
        staging.fault_point("claim:opened")
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file of this run's: at once
        os.rename(tmp, claim)
        claims[-1] = (claim, fd)
        return claim
    raise FileNotFoundError(2, "another process keeps removing it", str(base))


@contextlib.contextmanager
def claim_data_name(folder: Path, model_name: str) -> Iterator[str]:
    """A data file name for a new ``folder/model_name`` that no file in ``folder`` has and no other live run
    claims (``NAME.data`` when free, else ``NAME.<8 hex>.data``), claimed until the block ends."""
    base = folder / staging.STAGING
    name = f"{model_name}.data"
    claims: list[tuple[Path, int]] = []
    try:
        with interrupt.deferred():  # each claim made and recorded in one step, inside the try that removes it
            while True:
                if not os.path.lexists(folder / name) and not claimed_by_other(folder, name):
                    try:
                        claim = _claim(base, name, claims)
                    except OSError as exc:  # as staging_dir says it (a read-only folder, one without flock)
                        raise InputError(f"{folder}: cannot write there ({exc.strerror or exc}); choose an output "
                                         "folder you can write to") from exc
                    if not claimed_by_other(folder, name, claim):  # no one claimed it at the same moment
                        break
                    _release(base, *claims.pop())
                name = f"{model_name}.{secrets.token_hex(4)}.data"
        yield name
    finally:
        while claims:
            _release(base, *claims.pop())


def _release(base: Path, claim: Path, fd: int) -> None:
    with interrupt.deferred():  # a second signal during the clean-up of an interrupted run must not stop it
        claim.unlink(missing_ok=True)
        os.close(fd)
        with contextlib.suppress(OSError):
            base.rmdir()  # only when empty


def data_family(folder: Path, model_name: str) -> list[Path]:
    """The data files in ``folder`` named for output ``model_name`` (see module docstring)."""
    pattern = re.compile(re.escape(model_name) + r"(\.[0-9a-f]{8})?\.data")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(folder / n for n in names if pattern.fullmatch(n))


def commit_model(staged: Path, dest: Path, data_name: str | None) -> None:
    """Move ``staged`` (and its data file ``data_name`` beside it, if any) onto ``dest``; see module docstring."""
    parent = dest.parent if str(dest.parent) else Path(".")
    data = staged.with_name(data_name) if data_name else None
    if data is not None and data.exists():
        os.chmod(data, os.stat(staged).st_mode & 0o7777)  # the same permissions as the model file that needs it
    pairing.seal_report(staged, dest)  # a report staged for it records this model's sha256
    staging.fault_point("model:staged")
    interrupt.check()  # a signal while saving: commit nothing
    with interrupt.deferred():
        if data is not None and data.exists():
            staging.fault_point("model:before-data-rename")
            os.replace(data, parent / data.name)
            staging.fault_point("model:data-renamed")
        os.replace(staged, dest)  # the commit point
        pairing.committed()  # its report (fsutil.staged_json) is committed now, whatever comes
        staging.fault_point("model:committed")
        keep = parent / data_name if data_name else None
        for old in data_family(parent, dest.name):
            if old != keep and not claimed_by_other(parent, old.name):  # not another run's, mid-commit
                old.unlink(missing_ok=True)
