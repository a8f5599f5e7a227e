"""Helpers for tests, importable as ``from trtforge_testing import ...``.

pytest's pythonpath includes tests/_support.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"


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
    """The DESIGN section 3 error contract: exit code, one 'error:' line on stderr, no traceback."""
    assert res.code == code, (res.code, res.err)
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert len(lines) == 1, res.err
    assert lines[0].startswith("error: "), res.err
    assert "Traceback" not in res.err
    for n in needles:
        assert n in lines[0], (n, lines[0])
