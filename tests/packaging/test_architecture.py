"""Conventions that hold the architecture (docs/architecture.md), checked over the sources:

- size: modules under 400 lines, functions and methods under 60; today's exceptions live in ``EXCEPTIONS`` below,
  each with its reason, and an entry that is no longer needed fails too (the list only shrinks);
- the environment is read only through ``build_engine/core/env.py``;
- tests do not skip when a trtforge module fails to import, and every random generator in tests is seeded;
- shipped files cite only files that ship (no design document outside the project);
- fold passes count their rewrites under ``GraphPass.name``; library code logs, only front ends print.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("build_engine", "plugins", "scheduler", "profiles", "examples")
SIZED = (*PACKAGES, "bench", "tests")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# The one list of size exceptions: "path" (a module) or "path::function" -> why it is still over.
EXCEPTIONS: dict[str, str] = {
    "build_engine/engine/builder.py::_tensorrt": "one TensorRT session: parser, builder config, profiles, plugin "
                                                 "registration and the plan, whose objects must outlive each call",
    "build_engine/precision/convert.py::convert_precision": "one pass over the graph whose phases share the node "
                                                             "decisions and the type map; splitting needs a state "
                                                             "object",
    "plugins/lora/trt_plugin.py::make_plugin_classes": "builds the IPluginV3 classes on the TensorRT module chosen "
                                                       "at run time (their base classes come from it)",
    "bench/lora_kernel.py::_run_case": "one benchmark case timed against every anchor (torch, triton, cupy)",
    "bench/lora_kernel.py::main": "argument handling and the PASS/MISS table of the GPU benchmark",
    "tests/_support/lora_kernel_mirror.py::fused_launch": "a line-by-line NumPy mirror of the CUDA kernel; its "
                                                          "structure must match kernel.cu's",
}


def _sources(folders: tuple[str, ...]) -> Iterator[Path]:
    for folder in folders:
        yield from sorted((REPO / folder).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _sizes() -> dict[str, int]:
    """Every module over the module limit and every function over the function limit, with its length."""
    out: dict[str, int] = {}
    for path in _sources(SIZED):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            out[_rel(path)] = lines
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = (node.end_lineno or node.lineno) - start + 1
                if length > MAX_FUNCTION_LINES:
                    out[f"{_rel(path)}::{node.name}"] = length
    return out


def test_modules_and_functions_stay_small() -> None:
    sizes = _sizes()
    new = {k: v for k, v in sizes.items() if k not in EXCEPTIONS}
    assert not new, (f"over {MAX_MODULE_LINES} lines per module / {MAX_FUNCTION_LINES} per function: {new}; split "
                     "them (or, if it truly cannot be split, add an entry with its reason to EXCEPTIONS in "
                     f"{_rel(Path(__file__))})")
    stale = sorted(set(EXCEPTIONS) - set(sizes))
    assert not stale, f"no longer over the limit, remove from EXCEPTIONS in {_rel(Path(__file__))}: {stale}"


_ENV_READ = re.compile(r"os\.environ\b|os\.getenv\b|getenv\(")


def test_environment_is_read_only_through_core_env() -> None:
    env_module = REPO / "build_engine/core/env.py"
    offenders = [f"{_rel(p)}:{i}" for p in _sources(PACKAGES) if p != env_module
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if _ENV_READ.search(line) and not line.lstrip().startswith(("#", "(``", "``"))]
    assert not offenders, f"read environment variables through build_engine/core/env.py (a Knob): {offenders}"


def test_every_knob_is_documented() -> None:
    from trtforge.build_engine.core import env

    names = [k.name for k in env.KNOBS]
    assert len(names) == len(set(names))
    declared = {v.name for v in vars(env).values() if isinstance(v, env.Knob)}
    assert declared == set(names), f"knobs missing from KNOBS: {declared - set(names)}"
    for knob in env.KNOBS:
        # Another tool's variable is spelled as that tool reads it (Ray's RAY_<config name> is lower case).
        assert knob.meaning.strip() and (knob.name.isupper() or knob.owner != "trtforge"), knob


def _skips_on_trtforge_import(tree: ast.AST) -> list[int]:
    """Lines that skip a test when a trtforge module cannot be imported."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "importorskip"
                and node.args and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("trtforge")):
            lines.append(node.lineno)
        if isinstance(node, ast.Try):
            imports_ours = any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("trtforge")
                               or isinstance(n, ast.Import) and any(a.name.startswith("trtforge") for a in n.names)
                               for stmt in node.body for n in ast.walk(stmt))
            skips = any("skip" in ast.unparse(h) for h in node.handlers)
            if imports_ours and skips:
                lines.append(node.lineno)
    return lines


def test_tests_fail_when_a_trtforge_module_cannot_import() -> None:
    offenders = [f"{_rel(p)}:{line}" for p in _sources(("tests",))
                 for line in _skips_on_trtforge_import(ast.parse(p.read_text()))]
    assert not offenders, f"import trtforge modules plainly, so their breakage fails the test: {offenders}"


# An unseeded generator: default_rng() / RandomState() / Random() with no seed, or NumPy's and random's global state.
_UNSEEDED = re.compile(r"default_rng\(\s*\)|RandomState\(\s*\)|random\.Random\(\s*\)"
                       r"|np\.random\.(rand|randn|randint|random|normal|uniform|choice|permutation|shuffle|bytes)\("
                       r"|(?<![\w.])random\.(random|randint|choice|shuffle|uniform|sample|gauss)\(")


def test_every_test_generator_is_seeded() -> None:
    offenders = [f"{_rel(p)}:{i}: {line.strip()}" for p in _sources(("tests",))
                 for i, line in enumerate(p.read_text().splitlines(), 1) if _UNSEEDED.search(line)
                 and p.name != Path(__file__).name]
    assert not offenders, ("seed it: use the rng fixture (tests/conftest.py) or trtforge_testing.seeded_rng(label): "
                           f"{offenders}")


_OUTSIDE_DOC = re.compile(r"DESIGN|\.\./shared/\S*\.md")


def test_shipped_files_cite_only_shipped_files() -> None:
    shipped = [*_sources((*PACKAGES, "bench", "tests")), REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    offenders = [f"{_rel(p)}:{i}" for p in shipped if p != Path(__file__)
                 for i, line in enumerate(p.read_text().splitlines(), 1) if _OUTSIDE_DOC.search(line)]
    assert not offenders, f"cite docs/architecture.md or a file in the project, not an outside document: {offenders}"


def test_pass_counters_report_the_pass_name() -> None:
    """``GraphPass.name`` is what fold's report counts: passes count under ``self.name``, never a separate literal."""
    literal = re.compile(r"rules\[\s*[\"']|bypass\([^)]*,\s*[\"'][a-z_]+[\"']\s*\)")
    offenders = [f"{_rel(p)}:{i}" for p in sorted((REPO / "build_engine/passes").glob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert not offenders, f"count rewrites under self.name (GraphPass.name): {offenders}"


# Modules that are command-line front ends and may print: the CLI, and the example script's own main.
_MAY_PRINT = ("build_engine/cli/", "examples/make_example.py")
_PRINT = re.compile(r"(^|[^\w.])print\(|sys\.std(err|out)\.write\(")


def test_library_code_logs_instead_of_printing() -> None:
    offenders = [f"{_rel(p)}:{i}" for p in _sources(PACKAGES) if not _rel(p).startswith(_MAY_PRINT)
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if _PRINT.search(line) and not line.lstrip().startswith("#")]
    assert not offenders, f"log through logging.getLogger('trtforge...') (build_engine/core/log.py): {offenders}"
