"""``trtforge demo [--workdir DIR]``: the whole pipeline on the bundled example model.

The steps live in trtforge.examples.demo.
"""

from __future__ import annotations

import time
from argparse import ArgumentParser
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.errors import InputError
from ._common import make_parser, run_command, stdout_console


def build_parser() -> ArgumentParser:
    p = make_parser("trtforge demo", "Run the whole pipeline on the bundled example Llama: fold, precision, LoRA "
                    "inject, TensorRT-RTX builds for a10 and a100, Triton repository, diffs, kv-plan, simulate, and "
                    "quantize int8 / int4-wo / fp8 with builds for a100 and l40s.")
    p.add_argument("--workdir", type=Path, default=Path("trtforge-demo"),
                   help="folder for every step's output (default ./trtforge-demo; reused if it exists)")
    return p


def _run(args: Any) -> int:
    from rich.markup import escape
    from rich.table import Table

    from trtforge.examples.demo import run_demo, write_summary

    work: Path = args.workdir
    if work.exists() and not work.is_dir():
        raise InputError(f"{work} exists and is not a folder; pass --workdir with a folder path")
    _refuse_foreign_workdir(work)
    t0 = time.perf_counter()
    results = run_demo(work)
    total = time.perf_counter() - t0
    write_summary(work, results)
    table = Table(title=escape(f"trtforge demo: {work}") + f" ({total:.0f} s)")
    for col in ("step", "status", "s", "result"):
        table.add_column(col, overflow="fold")
    for r in results:
        style = {"ok": "green", "failed": "bold red"}.get(r.status, "yellow")
        table.add_row(escape(r.name), f"[{style}]{escape(r.status)}[/]", f"{r.seconds:.1f}", escape(r.detail))
    console = stdout_console()
    if not console.is_terminal:
        console.width = 150  # logs and the README keep the table readable
    console.print()
    console.print(table)
    failed = [r.name for r in results if r.status == "failed"]
    console.print(escape(f"summary: {work / 'summary.md'}; plot: {work / '08_sim' / 'cache-aware.png'}"))
    if failed:
        console.print(f"[bold red]{len(failed)} step(s) failed:[/] {', '.join(failed)}")
        return 1
    return 0


#: What an earlier demo run leaves in its workdir (trtforge.examples.demo.run_demo's folders and summaries).
_DEMO_NAMES = frozenset({"00_model", "01_fold", "02_precision", "03_lora", "04_engines", "05_triton", "06_diff",
                         "07_kv", "08_sim", "09_quantize", "summary.json", "summary.md"})


def _refuse_foreign_workdir(work: Path) -> None:
    """The demo writes fixed names into --workdir and reuses an earlier demo's folder; a folder that holds
    anything else (the user's files) is refused instead of written over."""
    if not work.is_dir():
        return
    names = {p.name for p in work.iterdir()}
    if names and "00_model" not in names:
        first = sorted(names)[0]
        raise InputError(f"--workdir {work} holds files that are not from an earlier trtforge demo ({first}); the "
                         "demo would write over them; pass a new or empty folder")


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
