"""``python -m trtforge.build_engine.cli`` runs the same CLI as the console script."""

from __future__ import annotations

import subprocess
import sys


def test_module_entry_runs_the_cli() -> None:
    res = subprocess.run([sys.executable, "-m", "trtforge.build_engine.cli", "profiles"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "a100" in res.stdout


def test_module_entry_keeps_the_exit_codes() -> None:
    res = subprocess.run([sys.executable, "-m", "trtforge.build_engine.cli", "fold", "missing.onnx", "-o", "x.onnx"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.startswith("error:") and "Traceback" not in res.stderr
