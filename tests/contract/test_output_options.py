"""The output options of every command, table-driven: one spelling for each (``--force``, ``--report``, ``--debug``,
``-v/--verbose``, ``-q/--quiet``, ``--progress``) and one behaviour: an existing output FILE is replaced (with or
without ``--force``), an existing output FOLDER only with ``--force``, and ``--force`` never lets an output
overwrite or delete an input (same path, a symlink or hard link to it, a folder that holds it, its external data)."""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from trtforge.build_engine.cli import COMMANDS
from trtforge_testing import CliResult, assert_one_line_error

from . import fixtures as fx

Build = Callable[[Path], tuple[list[str], Path]]  # folder -> (argv, the output path it names)


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, and each sub-command's (``lora inject``, ``cache key``...)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for name, (module, _) in COMMANDS.items():
        parser = importlib.import_module(f"trtforge.build_engine.cli.{module}").build_parser()
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        found[name] = parser
        for sub in subs:
            found.update({f"{name} {n}": p for n, p in sub.choices.items()})
    return found


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in parser._actions for opt in a.option_strings}


#: Commands that write files, and the option naming each JSON report they write.
FILE_WRITERS = {"fold": "--report", "precision": "--report", "quantize": "--report", "lora inject": None,
                "lora decompose": None, "lora pack": None, "diff": "--save", "kv-plan": "--json", "simulate": "--json"}
FOLDER_WRITERS = {"build", "triton"}


def test_every_command_spells_the_common_options_alike() -> None:
    parsers = _parsers()
    assert set(FILE_WRITERS) | FOLDER_WRITERS <= set(parsers)
    for name, parser in parsers.items():
        if isinstance(next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None),
                      argparse._SubParsersAction):
            continue  # 'trtforge lora' / 'trtforge cache' themselves: their sub-commands are checked
        opts = _options(parser)
        for spelling in ("--debug", "--progress", "-v", "--verbose", "-q", "--quiet"):
            assert spelling in opts, (name, spelling)
        if name in FILE_WRITERS or name in FOLDER_WRITERS:
            assert "--force" in opts and opts["--force"].nargs == 0, name
        report = FILE_WRITERS.get(name)
        if report is not None:  # one spelling for a JSON report: --report works wherever there is one
            assert opts["--report"] is opts[report], name
        if "-o" in opts:
            assert opts["-o"] is opts["--output"], name


# ------------------------------------------------------------------------------------------- file outputs replaced
def _tiny(t: Path) -> Path:
    return fx.tiny_model(t / "in.onnx", seed=3)


FILE_CASES: dict[str, Build] = {
    "fold -o": lambda t: (["fold", str(_tiny(t)), "-o", str(t / "out.onnx")], t / "out.onnx"),
    "fold --report": lambda t: (["fold", str(_tiny(t)), "-o", str(t / "o.onnx"), "--report", str(t / "r.json")],
                                t / "r.json"),
    "precision -o": lambda t: (["precision", str(_tiny(t)), "-o", str(t / "out.onnx"), "--to", "fp16"],
                               t / "out.onnx"),
    "quantize --report": lambda t: (["quantize", str(fx.llama(t / "m.onnx")), "-o", str(t / "q.onnx"), "--mode",
                                     "int8", "--calib-size", "2", "--report", str(t / "r.json")], t / "r.json"),
    "lora inject -o": lambda t: (["lora", "inject", str(fx.llama(t / "m.onnx")), "-o", str(t / "out.onnx"),
                                  "--targets", "q_proj", "--max-rank", "4", "--slots", "2"], t / "out.onnx"),
    "lora decompose -o": lambda t: (["lora", "decompose", str(fx.injected_model(t / "m.onnx")), "-o",
                                     str(t / "out.onnx")], t / "out.onnx"),
    "lora pack -o": lambda t: (["lora", "pack", str(fx.adapter(t / "ad")), "--targets", "q_proj", "-o",
                                str(t / "pool.safetensors")], t / "pool.safetensors"),
    "diff --report": lambda t: (["diff", str(_tiny(t)), str(_tiny(t)), "--report", str(t / "r.json")],
                                t / "r.json"),
    "kv-plan --report": lambda t: (["kv-plan", "--profile", "a100", "--model", "llama-3.1-8b", "--report",
                                    str(t / "kv.json")], t / "kv.json"),
    "simulate --json": lambda t: (["simulate", "--trace", str(fx.trace(t / "t.jsonl")), "--profile", "a100",
                                   "--model", "llama-3.1-8b", "--policy", "cache-aware", "--json", str(t / "s.json")],
                                  t / "s.json"),
}


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("name", list(FILE_CASES))
def test_an_existing_output_file_is_replaced(cli, tmp_path: Path, name: str, force: bool) -> None:
    argv, out = FILE_CASES[name](tmp_path)
    out.write_bytes(b"an older output\n")
    res: CliResult = cli(*argv, *(["--force"] if force else []))
    assert res.code == 0, (name, res.err)
    assert out.read_bytes() != b"an older output\n" and out.stat().st_size > 0, name
    assert not (tmp_path / ".trtforge-staging").exists(), name


# --------------------------------------------------------------------------------------- folder outputs need --force
def _build(t: Path) -> tuple[list[str], Path]:
    return (["build", str(_tiny(t)), "--profile", "a100", "-o", str(t / "eng"), "--backend", "tensorrt-rtx",
             "--no-progress"], t / "eng")


def _triton(t: Path) -> tuple[list[str], Path]:
    return ["triton", str(fx.engine(t / "eng")), "--repo", str(t / "repo"), "--name", "m", "--no-warmup"], t / "repo/m"


@pytest.mark.parametrize("build", [_build, _triton], ids=["build -o", "triton --repo/--name"])
def test_an_existing_output_folder_needs_force(cli, tmp_path: Path, build: Build) -> None:
    pytest.importorskip("tensorrt_rtx")
    argv, out = build(tmp_path)
    out.mkdir(parents=True)
    (out / "older.txt").write_text("an older output\n")
    res: CliResult = cli(*argv)
    assert_one_line_error(res, 2, "--force")
    assert sorted(p.name for p in out.iterdir()) == ["older.txt"]
    res = cli(*argv, "--force")
    assert res.code == 0, res.err
    assert not (out / "older.txt").exists() and any(out.iterdir())


# ------------------------------------------------------------------------------- --force never overwrites an input
def _linked(kind: str) -> Build:
    def build(t: Path) -> tuple[list[str], Path]:
        m = _tiny(t)
        out = t / f"{kind}.onnx"
        if kind == "symlink":
            out.symlink_to(m)
        else:
            os.link(m, out)
        return ["fold", str(m), "-o", str(out)], m
    return build


def _build_over_source(t: Path) -> tuple[list[str], Path]:
    (t / "src").mkdir()
    return ["build", str(fx.tiny_model(t / "src" / "in.onnx")), "--profile", "a100", "-o", str(t / "src")], \
        t / "src" / "in.onnx"


def _triton_over_engine(t: Path) -> tuple[list[str], Path]:
    fx.engine(t / "repo" / "m")
    return ["triton", str(t / "repo" / "m"), "--repo", str(t / "repo"), "--name", "m"], t / "repo" / "m" / "model.plan"


INPUT_CASES: dict[str, Build] = {
    "fold -o IN": lambda t: (["fold", str(_tiny(t)), "-o", str(t / "in.onnx")], t / "in.onnx"),
    "fold -o symlink to IN": _linked("symlink"),
    "fold -o hard link to IN": _linked("hard"),
    "fold -o the input's data file": lambda t: (["fold", str(fx.external_model(t / "e.onnx")), "-o",
                                                 str(t / "e.onnx.data")], t / "e.onnx.data"),
    "precision --report IN": lambda t: (["precision", str(_tiny(t)), "-o", str(t / "o.onnx"), "--to", "fp16",
                                         "--report", str(t / "in.onnx")], t / "in.onnx"),
    "quantize -o IN": lambda t: (["quantize", str(fx.llama(t / "m.onnx")), "-o", str(t / "m.onnx"), "--mode",
                                  "int8"], t / "m.onnx"),
    "lora inject -o IN": lambda t: (["lora", "inject", str(fx.llama(t / "m.onnx")), "-o", str(t / "m.onnx"),
                                     "--targets", "q_proj"], t / "m.onnx"),
    "lora decompose -o IN": lambda t: (["lora", "decompose", str(fx.injected_model(t / "m.onnx")), "-o",
                                        str(t / "m.onnx")], t / "m.onnx"),
    "lora pack -o the adapter's weights": lambda t: (
        ["lora", "pack", str(fx.adapter(t / "ad")), "--targets", "q_proj", "-o",
         str(t / "ad" / "adapter_model.safetensors")], t / "ad" / "adapter_model.safetensors"),
    "diff --report A": lambda t: (["diff", str(_tiny(t)), str(fx.tiny_model(t / "b.onnx")), "--report",
                                   str(t / "in.onnx")], t / "in.onnx"),
    "kv-plan --report CONFIG": lambda t: (["kv-plan", "--profile", "a100", "--model", str(fx.hf_config(t / "c.json")),
                                           "--report", str(t / "c.json")], t / "c.json"),
    "simulate --json TRACE": lambda t: (["simulate", "--trace", str(fx.trace(t / "t.jsonl")), "--profile", "a100",
                                         "--model", "llama-3.1-8b", "--policy", "cache-aware", "--json",
                                         str(t / "t.jsonl")], t / "t.jsonl"),
    "build -o the folder holding IN": _build_over_source,
    "triton --repo/--name the engine folder": _triton_over_engine,
}


@pytest.mark.parametrize("name", list(INPUT_CASES))
def test_force_never_overwrites_an_input(cli, tmp_path: Path, name: str) -> None:
    if name.startswith("triton"):
        pytest.importorskip("tensorrt_rtx")
    argv, protected = INPUT_CASES[name](tmp_path)
    before = protected.read_bytes()
    res: CliResult = cli(*argv, "--force")
    assert_one_line_error(res, 2, "input", "with or without --force")  # refused as an input, not as an option
    assert protected.read_bytes() == before, name
