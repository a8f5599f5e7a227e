"""Packaging: the trtforge.* namespace mapping, lazy heavy imports, and the console script."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAPPED = {"plugins": "trtforge.plugins", "build_engine": "trtforge.build_engine", "scheduler": "trtforge.scheduler",
          "profiles": "trtforge.profiles", "examples": "trtforge.examples"}
HEAVY = ("tensorrt", "tensorrt_rtx", "onnxruntime", "polygraphy", "cuda", "torch", "tritonclient", "matplotlib",
         "prometheus_client", "safetensors")


def _py(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_package_dir_maps_each_folder_into_the_namespace() -> None:
    cfg = _pyproject()["tool"]["setuptools"]
    assert cfg["package-dir"] == {v: k for k, v in MAPPED.items()}


def test_every_subpackage_is_declared() -> None:
    declared = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = set()
    for folder, name in MAPPED.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            found.add(".".join([name, *rel.parts]))
    assert found == declared, f"undeclared: {found - declared}, declared but missing: {declared - found}"


def test_bare_folder_names_are_not_importable(tmp_path: Path) -> None:
    # Run outside the repository so its root is not on sys.path (as for an installed user).
    for bare in MAPPED:
        res = _py(f"import {bare}", tmp_path)
        assert res.returncode != 0 and "ModuleNotFoundError" in res.stderr, (bare, res.stderr)
    for name in MAPPED.values():
        res = _py(f"import {name}", tmp_path)
        assert res.returncode == 0, (name, res.stderr)


def test_importing_every_module_loads_no_heavy_library(tmp_path: Path) -> None:
    code = f"""
import importlib, pkgutil, sys
names = []
for pkg in {sorted(MAPPED.values())!r}:
    mod = importlib.import_module(pkg)
    names.append(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        importlib.import_module(info.name)
        names.append(info.name)
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
print(len(names), ",".join(heavy))
"""
    res = _py(code, tmp_path)
    assert res.returncode == 0, res.stderr
    count, heavy = res.stdout.strip().split(" ", 1) if " " in res.stdout.strip() else (res.stdout.strip(), "")
    assert int(count) >= 10
    assert heavy == "", f"importing trtforge loaded: {heavy}"


def test_console_script_help_lists_commands(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("trtforge")
    res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr
    for cmd in ("fold", "precision", "lora", "profiles", "build", "kv-plan", "triton", "diff", "simulate", "demo"):
        assert f"  {cmd} " in res.stdout, cmd
    # Speed comes from laziness, proven by the import test above (no timing assertions in tests).
    assert "tensorrt" not in res.stderr
    ver = subprocess.run([str(exe), "--version"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert ver.returncode == 0 and ver.stdout.startswith("trtforge ")


def test_every_registered_command_module_exists_and_has_main() -> None:
    import importlib

    from trtforge.build_engine.cli import COMMANDS

    for name, (module, _) in COMMANDS.items():
        mod = importlib.import_module(f"trtforge.build_engine.cli.{module}")
        assert callable(getattr(mod, "main", None)), name


def test_readme_names_every_extra() -> None:
    """The README's Extras line named neither ``cache`` (the response cache's cachetools, redis, faiss-cpu, orjson)
    nor ``cluster`` (ray, which ``all`` does not install)."""
    import re

    text = (REPO / "README.md").read_text()
    line = " ".join(text[text.index("\nExtras: "):].split("\n\n", 1)[0].split())
    named = set(re.findall(r"`([a-z]+)`", line))
    assert set(_pyproject()["project"]["optional-dependencies"]) <= named, line
    assert "cluster" not in str(_pyproject()["project"]["optional-dependencies"]["all"]) and "not in `all`" in line
