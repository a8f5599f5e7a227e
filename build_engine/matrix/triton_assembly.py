"""Assemble a Triton model repository from the built and cached cells of a matrix run.

Each engine becomes ``REPO/<model>_<profile>/`` through the same writer as ``trtforge triton`` (validated config,
atomic entry). An engine that needs trtforge's Python plugin is skipped with its reason (Triton's TensorRT backend
cannot load a Python plugin), recorded in the cell's ``reason``; the cell itself stays built.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from ..core.errors import TrtforgeError
from .cells import Cell


class CellView(Protocol):
    """What ``assemble`` reads and sets of a ``driver.CellStatus``; typed here because the driver imports this."""

    cell: Cell
    status: str
    reason: str
    outdir: str


def entry_name(model: str, profile: str) -> str:
    return f"{model}_{profile}"


def assemble(cells: Iterable[CellView], repo: Path) -> list[str]:
    """Write one entry per built/cached cell; returns the entry names written."""
    from ..triton.repo import write_entry

    repo.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for st in cells:
        if st.status not in ("built", "cached"):
            continue
        name = entry_name(st.cell.model.name, st.cell.profile_name)
        try:
            write_entry(st.outdir, repo, name, force=True)
            written.append(name)
        except TrtforgeError as exc:
            st.reason = f"not added to the Triton repository: {exc.message}"
    return written
