"""Committing a saved ONNX model and its external data: the model file's rename is the single commit point.

A model with external data is two files. Renaming the data file onto the old one and then the model file would,
after a kill between the two renames, pair the old model with the new weights. So the new data file gets a name
the old model does not use (``NAME.data`` when that is free, else ``NAME.<8 hex>.data``), is renamed in first (the
old model still reads its own data file), and only the model's rename publishes the new pair. Afterwards the data
files of the ``NAME.data`` / ``NAME.<hex>.data`` family other than the new one (the old model's, or an orphan of a
killed run) are removed: those names belong to output ``NAME``.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from . import interrupt, staging


def fresh_data_name(folder: Path, model_name: str) -> str:
    """A data file name for a new ``folder/model_name`` that no existing file in ``folder`` has."""
    plain = f"{model_name}.data"
    if not os.path.lexists(folder / plain):
        return plain
    while True:
        name = f"{model_name}.{secrets.token_hex(4)}.data"
        if not os.path.lexists(folder / name):
            return name


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
    staging.fault_point("model:staged")
    interrupt.check()  # a signal while saving: commit nothing
    with interrupt.deferred():
        if data is not None and data.exists():
            staging.fault_point("model:before-data-rename")
            os.replace(data, parent / data.name)
            staging.fault_point("model:data-renamed")
        os.replace(staged, dest)  # the commit point
        staging.fault_point("model:committed")
        keep = parent / data_name if data_name else None
        for old in data_family(parent, dest.name):
            if old != keep:
                old.unlink(missing_ok=True)
