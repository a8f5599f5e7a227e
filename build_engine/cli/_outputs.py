"""Output paths checked up front: a command that writes several files refuses a bad one before writing any.

A thin front of ``core.paths.check`` (the one implementation of the never-overwrite-an-input rule) that also
checks each output file can be written (its folder exists, it is not a folder)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..core import fsutil, paths

Named = tuple[str, str | os.PathLike[str] | None]


def if_exists(name_or_path: str | None) -> str | None:
    """A --model/--profile/--trace that names an existing file or folder is an input to protect; a preset name
    (``a100``, ``llama-3.1-8b``, ``synthetic:N``) is not."""
    return name_or_path if name_or_path and Path(name_or_path).exists() else None


def check_outputs(*named: Named, inputs: Sequence[Named] = (), folders: Sequence[Named] = ()) -> None:
    """``named``: (option, path or None when not given) of each output file; ``inputs``: what the command reads;
    ``folders``: output folders replaced as a whole. No output may be, contain or be inside an input, or name the
    same file as another output, or be a device/FIFO/socket."""
    paths.check(inputs=inputs, files=named, folders=folders)
    for label, folder in folders:
        if folder:
            fsutil.check_output_folder(folder, label)
    for _, path in named:
        if path:
            fsutil.check_output_file(path)
