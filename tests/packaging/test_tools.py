"""The architecture tools run with the tests, on the installed package, with the configuration in pyproject.toml:
import-linter (the layer contracts), mypy, deptry (declared vs imported dependencies), and the import-graph printer.
Each fails with the tool's own output."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MYPY_TARGETS = ("build_engine", "plugins", "scheduler", "profiles", "examples")


def _tool(name: str) -> str:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or name


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout)


def test_import_contracts_hold() -> None:
    """lint-imports reads [tool.importlinter] and analyses the installed trtforge.* packages (not the folders)."""
    res = _run([_tool("lint-imports"), "--no-cache", "--no-logo", str(REPO / "pyproject.toml")], cwd=REPO)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout, res.stdout[-2000:]


def test_import_graph_prints_every_package(tmp_path: Path) -> None:
    res = _run([sys.executable, str(REPO / "tests/packaging/import_graph.py")], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = dict(line.split(" -> ", 1) for line in res.stdout.splitlines())
    lines = {k.strip(): v for k, v in lines.items()}
    assert lines["trtforge.build_engine.core"] == "(nothing of trtforge)"
    assert "trtforge.scheduler" in lines["trtforge.build_engine.cli"]
    assert {"trtforge.plugins", "trtforge.plugins.lora", "trtforge.scheduler.sim", "trtforge.profiles",
            "trtforge.examples", "trtforge.build_engine.verify"} <= set(lines)


def test_mypy_is_clean() -> None:
    # The cache lives outside the repository and survives between runs (a cold run takes about a minute).
    cache = Path(tempfile.gettempdir()) / "trtforge-mypy-cache"
    res = _run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(cache),
                *MYPY_TARGETS], cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stdout[-8000:] + res.stderr[-2000:]


def test_dependencies_are_declared_and_used() -> None:
    res = _run([_tool("deptry"), "."], cwd=REPO)  # "." so its default excludes (tests/, .venv/) match
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-4000:]
