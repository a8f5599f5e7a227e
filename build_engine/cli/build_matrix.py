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
    p.add_argument("--jobs", type=int, default=2, help="builds at once (local workers, or CPUs of a local Ray cluster)")
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


def _print_table(report: Any) -> None:
    from rich.table import Table

    from ._common import stdout_console

    table = Table(title=f"build-matrix ({report.executor}, {report.seconds:.1f} s)")
    for col in ("model", "profile", "status", "seconds", "plan", "reason"):
        table.add_column(col)
    for st in report.cells:
        plan = f"{st.plan_bytes / 2**20:.1f} MiB" if st.plan_bytes else ""
        table.add_row(st.cell.model.name, st.cell.profile_name, st.status, f"{st.seconds:.1f}", plan, st.reason)
    stdout_console().print(table)


def _run(args: Any) -> int:
    if args.node_resources:
        from ..matrix.cells import node_resources

        print(f"--resources='{json.dumps(node_resources(), sort_keys=True)}'")
        return 0
    if not args.matrix or not args.output:
        fail("trtforge build-matrix: give MATRIX.toml and -o OUTROOT (or --node-resources); see --help")
    if not 1 <= args.jobs <= 256:
        fail(f"--jobs {args.jobs}: give a number from 1 to 256")
    if not 0 <= args.retries <= 20:
        fail(f"--retries {args.retries}: give a number from 0 to 20")
    from ..matrix.driver import run_matrix
    from ..matrix.spec import load_matrix

    spec = load_matrix(args.matrix)
    report = run_matrix(spec, Path(args.output), executor=args.executor, address=args.address, jobs=args.jobs,
                        retries=args.retries, dry_run=args.dry_run,
                        progress=None if args.dry_run else _progress_printer(sys.stderr))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_table(report)
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
