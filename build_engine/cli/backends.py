"""``trtforge backends [--json]``: the TensorRT backends found here, their versions, targets and whether they run."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from collections.abc import Sequence
from typing import Any

from ._common import make_parser, run_command, stdout_console


def build_parser() -> ArgumentParser:
    p = make_parser("trtforge backends", "Show the TensorRT backends found, what they can target and whether they "
                                         "can run engines on this machine.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _rows() -> list[dict[str, Any]]:
    from ..engine.backend import available_backends, local_gpu_compute_capabilities

    local = list(local_gpu_compute_capabilities())
    return [
        {"name": b.name, "version": b.version, "targets": list(b.targets), "can_run": b.can_run, "local_gpus": local}
        for b in available_backends()
    ]


def _run(args: Any) -> int:
    from ..engine.backend import INSTALL_RTX, INSTALL_TRT

    rows = _rows()
    if args.json:
        print(json.dumps({"backends": rows}, indent=2))
        return 0
    from rich.markup import escape  # INSTALL_RTX holds 'trtforge[rtx]', which rich would take as a style tag
    from rich.table import Table

    console = stdout_console()
    if not rows:
        console.print(escape(f"no TensorRT backend found; {INSTALL_RTX}, or {INSTALL_TRT}"))
        return 0
    table = Table(title="TensorRT backends")
    for col in ("name", "version", "targets (compute capability)", "can run here"):
        table.add_column(col)
    for r in rows:
        table.add_row(escape(r["name"]), escape(r["version"]), ", ".join(r["targets"]) or "-",
                      "yes" if r["can_run"] else "no")
    console.print(table)
    if not any(r["name"] == "tensorrt" for r in rows):
        console.print(escape(f"full TensorRT not found (needed for 9.0 / H100): {INSTALL_TRT}"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
