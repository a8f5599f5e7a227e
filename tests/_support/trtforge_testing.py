"""Helpers for tests, importable as ``from trtforge_testing import ...``.

pytest's pythonpath includes tests/_support.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"

# Every random test input comes from a seeded generator (the ``rng`` fixture, or ``seeded_rng`` where no fixture
# reaches). The base seed is in the pytest header and in a failing test's report; rerun with
#   TRTFORGE_TEST_SEED=<base seed> pytest <test id>
SEED_ENV = "TRTFORGE_TEST_SEED"
BASE_SEED = int(os.environ.get(SEED_ENV) or 20261201)


def seed_for(label: str) -> int:
    """The base seed mixed with a label (a test id, a helper's name), so generators do not share a stream."""
    return (BASE_SEED * 1_000_003 + zlib.crc32(label.encode())) % (1 << 32)


def seeded_rng(label: str) -> np.random.Generator:
    return np.random.default_rng(seed_for(label))


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_console(argv: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None,
                timeout: float = 600) -> CliResult:
    """Run the installed ``trtforge`` console script in a subprocess (for import-isolation checks)."""
    exe = Path(sys.executable).with_name("trtforge")
    proc = subprocess.run([str(exe), *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(res: CliResult, code: int = 2, *needles: str) -> None:
    """The CLI error contract (build_engine/cli/_common.py): exit code, one 'error:' line on stderr, no traceback."""
    assert res.code == code, (res.code, res.err)
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert len(lines) == 1, res.err
    assert lines[0].startswith("error: "), res.err
    assert "Traceback" not in res.err
    for n in needles:
        assert n in lines[0], (n, lines[0])
