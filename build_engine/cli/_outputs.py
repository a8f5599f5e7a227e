"""Output paths checked up front: a command that writes several files refuses a bad one before writing any."""

from __future__ import annotations

import os
from pathlib import Path

from ..core import fsutil
from ..core.errors import InputError


def check_outputs(*named: tuple[str, str | os.PathLike[str] | None]) -> None:
    """``named``: (option, path or None when not given). Each path must be writable as a file
    (``fsutil.check_output_file``) and no two options may name the same file (the later would overwrite the
    earlier)."""
    seen: dict[Path, str] = {}
    for option, path in named:
        if not path:
            continue
        p = Path(path)
        key = p.resolve()
        if key in seen:
            raise InputError(f"{p}: {option} and {seen[key]} name the same file; choose another {option} path")
        seen[key] = option
        fsutil.check_output_file(p)
