"""``trtforge profiles [NAME|PATH] [--json]``: list the built-in GPU profiles or show one in full."""

from __future__ import annotations

import json
from argparse import ArgumentParser, Namespace
from collections.abc import Sequence
from typing import Any

from trtforge.profiles.loader import Profile, list_profiles, load_profile, profile_rows, profile_to_dict

from ._common import make_parser, run_command, stdout_console


def build_parser() -> ArgumentParser:
    p = make_parser("trtforge profiles", "List the built-in GPU profiles, or show one (by name or .toml path).")
    p.add_argument("profile", nargs="?", help="profile name (e.g. a100) or path to a profile .toml; omit to list")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    return p


def _console() -> Any:
    """Rich console at least 120 columns wide, so piped output is not squeezed into 80."""
    console = stdout_console()
    console.width = max(console.width, 120)
    return console


def _fmt_num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    return f"{x:g}{unit}"


def _list(as_json: bool) -> int:
    profiles = [load_profile(n) for n in list_profiles()]
    if as_json:
        print(json.dumps([profile_to_dict(p) for p in profiles], indent=2))
        return 0
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="trtforge GPU profiles")
    for col in ("name", "GPU", "CC", "memory", "precision", "bandwidth", "fp16/bf16/fp8 TFLOP/s"):
        table.add_column(col)
    for p in profiles:
        hw = p.hardware
        prec = p.precision.dtype + (" (+fp8)" if p.precision.allow_fp8 else "")
        table.add_row(escape(p.name), escape(hw.name), hw.compute_capability, _fmt_num(hw.memory_gb, " GB"), prec,
                      _fmt_num(hw.memory_bandwidth_gbs, " GB/s"),
                      f"{hw.fp16_tflops:g}/{hw.bf16_tflops:g}/{_fmt_num(hw.fp8_tflops)}")
    _console().print(table)
    return 0


def _show(p: Profile) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = _console()
    table = Table(title=escape(f"profile {p.name}: {p.description}"), show_header=False)
    table.add_column("key")
    table.add_column("value")
    rows = profile_rows(p)
    for k, v in rows:
        table.add_row(escape(k), escape(v))
    console.print(table)


def _run(args: Namespace) -> int:
    if args.profile is None:
        return _list(args.json)
    profile = load_profile(args.profile)
    if args.json:
        print(json.dumps(profile_to_dict(profile), indent=2))
    else:
        _show(profile)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
