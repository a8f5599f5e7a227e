"""A report and the model it describes: two files, two renames, told apart when a kill split them.

``fold`` / ``precision`` / ``quantize --report`` stage the report first and commit the model, then the report
(``fsutil.staged_json``). Just before the model's rename (``model_commit.commit_model`` calls ``seal_report``)
the report is rewritten with ``output_sha256`` and ``output_bytes`` of the model file as it will be committed. A
``kill -9`` between the two renames leaves the new model beside the old report, whose sha256 is then the old
model's: ``report_matches`` says False. With external data the model file names its data file, and that name is
never the one the model being replaced reads (``model_commit``), so the model file's sha256 identifies its weights
file too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# realpath of a model output -> what writes its staged report's identity of the staged model
_SEALS: dict[str, Callable[[Path], None]] = {}


@contextlib.contextmanager
def sealed_by(model: str | os.PathLike[str] | None, seal: Callable[[Path], None]) -> Iterator[None]:
    """While the block runs, the commit of ``model`` first calls ``seal(staged model path)``; None: nothing."""
    if model is None:
        yield
        return
    key = os.path.realpath(model)
    _SEALS[key] = seal
    try:
        yield
    finally:
        _SEALS.pop(key, None)


def seal_report(staged: Path, dest: Path) -> None:
    """Called by ``model_commit`` before ``staged`` is renamed onto ``dest``."""
    seal = _SEALS.get(os.path.realpath(dest))
    if seal is not None:
        seal(staged)


def file_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``output_sha256`` and ``output_bytes`` of a file (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"output_sha256": digest.hexdigest(), "output_bytes": os.path.getsize(path)}


def report_matches(report: str | os.PathLike[str], model: str | os.PathLike[str]) -> bool:
    """Whether the report describes the model file now at ``model``: False after a kill between the model's and
    the report's renames (or for a report another run wrote, or one without ``output_sha256``)."""
    recorded = json.loads(Path(report).read_text(encoding="utf-8-sig")).get("output_sha256")
    return recorded is not None and recorded == file_identity(model)["output_sha256"]


class Member:
    """One output of a group written together (see ``group_member``); ``begun``: another output of the group is in
    place already, so this one must be committed too, whatever ends the block that writes it."""

    def __init__(self) -> None:
        self.begun = False


# The open ``group_member`` blocks, outermost first.
_OPEN: list[Member] = []


# Whether signals are held until the outermost open group block ends (``committed``).
_HOLDING = [False]


@contextlib.contextmanager
def group_member() -> Iterator[Member]:
    """Outputs whose writing blocks are nested (``fold --report``'s report around its model, ``diff --save``'s three
    files, ``simulate --json`` around ``--plot``) are one group: once one of them is renamed into place
    (``committed``), a signal or an error raised after that rename no longer stops the others (they were staged
    complete before the first rename), so the group ends all new, never the new model beside the old report.

    From that rename until the outermost block ends, signals are held (``interrupt.hold``) and raised after it: a
    signal in the instant between the inner block's end and the outer commit's start skipped that commit."""
    from . import interrupt

    member = Member()
    _OPEN.append(member)
    try:
        yield member
    finally:
        _OPEN.remove(member)
        if not _OPEN and _HOLDING[0]:
            _HOLDING[0] = False
            interrupt.release()


def committed() -> None:
    """An output has just been renamed into place: every output block still open around it commits as well."""
    from . import interrupt

    for member in _OPEN:
        member.begun = True
    if _OPEN and not _HOLDING[0]:
        _HOLDING[0] = True
        interrupt.hold()
