"""``trtforge build-matrix MATRIX.toml -o OUTROOT [--executor local|ray] [--address ADDR] [--jobs N] [--retries N]
[--dry-run]`` and ``trtforge build-matrix --node-resources``."""

from __future__ import annotations

import json
import sys
from argparse import ArgumentParser
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import fail, make_parser, run_command


def build_parser() -> ArgumentParser:
    p = make_parser(
        "trtforge build-matrix",
        "Build one engine per (model, GPU profile) of a matrix file, locally (a pool of worker processes) or on a "
        "Ray cluster; cached by content (source bytes, pipeline, profile, backend and versions), crashed workers "
        "retried, every cell folder written atomically. Writes OUTROOT/<model>/<profile>/ and OUTROOT/matrix.json. "
        "Exit 0 when every cell is built or cached, 1 when any failed or was refused, 2 for a bad matrix.",
    )
    p.add_argument("matrix", nargs="?", help="matrix file (.toml); see docs/scale-out.md")
    p.add_argument("-o", "--output", help="output root folder (created if missing)")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: worker processes on this machine (default); ray: tasks on a Ray cluster")
    p.add_argument("--address", default="local",
                   help="Ray cluster address (ray://host:10001 or host:6379); 'local' starts a local cluster")
    p.add_argument("--jobs", type=int, default=2,
                   help="builds at once (local workers, or CPUs of a local Ray cluster; default 2)")
    p.add_argument("--retries", type=int, default=2, help="retries of a cell whose worker died (default 2)")
    p.add_argument("--dry-run", action="store_true", help="print the cells, keys and cache state; build nothing")
    p.add_argument("--node-resources", action="store_true",
                   help="print the Ray resources this node should advertise (for 'ray start --resources') and exit")
    p.add_argument("--json", action="store_true", help="print matrix.json's content instead of the table")
    return p


def _progress_printer(stream: Any) -> Any:
    def show(st: Any) -> None:
        if st.status in ("built", "cached", "failed", "refused", "retry"):
            extra = f" ({st.reason})" if st.reason else ""
            stream.write(f"[{st.status}] {st.cell.label} {st.seconds:.1f} s{extra}\n")
            stream.flush()
    return show


def _table(title: str, cells: Any, started: dict[int, float] | None = None, keys: bool = False) -> Any:
    """One row per cell; ``keys`` (``--dry-run``, which promises the keys) adds each cell's cache key (its first 16
    hex digits, as matrix.json's ``key`` starts; ``--json`` prints it in full)."""
    import time

    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title))
    for col in ("model", "profile", *(("key",) if keys else ()), "status", "seconds", "plan", "reason"):
        table.add_column(col)
    for st in cells:
        plan = f"{st.plan_bytes / 2**20:.1f} MiB" if st.plan_bytes else ""
        secs = st.seconds
        if started is not None and st.status in ("running", "retry") and id(st) in started:
            secs = time.perf_counter() - started[id(st)]
        key = (st.cell.key[:16],) if keys else ()
        # plain Text, not markup: a reason or profile like "[batch, seq]" was swallowed as a style tag, and "[/]"
        # (an unknown profile's name) raised rich's MarkupError (exit 3, no table)
        row = (st.cell.model.name, st.cell.profile_name, *key, st.status, f"{secs:.1f}", plan, st.reason)
        table.add_row(*(Text(v) for v in row))
    return table


class _LiveTable:
    """A live rich table of every cell on a terminal (stderr); state and running time refresh twice a second."""

    def __init__(self) -> None:
        self.cells: list[Any] = []
        self.started: dict[int, float] = {}
        self.live: Any = None

    def __call__(self, st: Any) -> None:
        import time

        from rich.live import Live

        from ._common import stderr_console

        if all(c is not st for c in self.cells):
            self.cells.append(st)
        if st.status == "running":
            self.started.setdefault(id(st), time.perf_counter())
        if self.live is None:
            self.live = Live(get_renderable=lambda: _table("build-matrix", self.cells, self.started),
                             console=stderr_console(), refresh_per_second=2, transient=True)
            self.live.start()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()


def _run(args: Any) -> int:
    if args.node_resources:
        from ..matrix.cells import node_resources

        # No spaces or shell quotes: meant for `ray start ... $(trtforge build-matrix --node-resources)`.
        res = {k: int(v) if float(v).is_integer() else v for k, v in node_resources().items()}
        print("--resources=" + json.dumps(res, sort_keys=True, separators=(",", ":")))
        return 0
    if not args.matrix or not args.output:
        fail("trtforge build-matrix: give MATRIX.toml and -o OUTROOT (or --node-resources); see --help")
    if not 1 <= args.jobs <= 256:
        fail(f"--jobs {args.jobs}: give a number from 1 to 256")
    if not 0 <= args.retries <= 20:
        fail(f"--retries {args.retries}: give a number from 0 to 20")
    from ..core import paths
    from ..matrix.driver import run_matrix
    from ..matrix.spec import load_matrix

    paths.check(inputs=[("MATRIX.toml", args.matrix)])  # a FIFO here would block the read below forever
    spec = load_matrix(args.matrix)
    live = _LiveTable() if sys.stderr.isatty() and not args.dry_run else None
    progress = live if live is not None else (None if args.dry_run else _progress_printer(sys.stderr))
    try:
        report = run_matrix(spec, Path(args.output), executor=args.executor, address=args.address, jobs=args.jobs,
                            retries=args.retries, dry_run=args.dry_run, progress=progress)
    finally:
        if live is not None:
            live.stop()
    if args.json:
        from ..core.jsonout import dumps

        print(dumps(report.to_json(), indent=2))
    else:
        from ._common import stdout_console

        stdout_console().print(_table(f"build-matrix ({report.executor}, {report.seconds:.1f} s)", report.cells,
                                      keys=args.dry_run))
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
