"""Exit paths outside the bad-input table: an internal error is exit 3 with how to report it (not 1, "a check
failed"); a closed stdout (``trtforge ... | head``) exits quietly with 141 and no traceback; two processes creating
the TensorRT-RTX library link at once both succeed and leave one good link."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtforge_testing import CliResult


def test_internal_error_is_exit_3_with_how_to_report(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from trtforge.scheduler import kv_plan

    def broken(*_: object, **__: object) -> None:
        raise ZeroDivisionError("simulated bug")

    monkeypatch.setattr(kv_plan, "plan_kv", broken)
    res: CliResult = cli("kv-plan", "--profile", "a100", "--model", "llama-3.1-8b")
    assert res.code == 3
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: internal error: ZeroDivisionError: simulated bug")
    assert "--debug" in lines[0] and "report" in lines[0] and "Traceback" not in res.err


def _closed_stdout(argv: list[str]) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("trtforge")
    r, w = os.pipe()
    os.close(r)  # the reader left before the first byte, as `| head -0` (head -1 leaves a moment later)
    try:
        return subprocess.run([str(exe), *argv], stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)


@pytest.mark.parametrize("argv", [["--help"], ["profiles"],
                                  ["simulate", "--trace", "synthetic:20", "--profile", "a100", "--model",
                                   "llama-3.1-8b", "--policy", "cache-aware"]], ids=["help", "profiles", "simulate"])
def test_closed_stdout_exits_quietly(argv: list[str]) -> None:
    proc = _closed_stdout(argv)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""


_RACE = """
import os, sys
from pathlib import Path
from trtforge.build_engine.engine import backend as b
be = b.select_backend("tensorrt-rtx")
libs = Path(sys.argv[1])
link = libs / "libtensorrt_rtx.so"
for i in range(300):
    if i % 2:  # a dangling link (left by an uninstalled wheel) is what the other process is replacing
        tmp = libs / f"dangling.{os.getpid()}"
        os.symlink("missing.so", tmp)
        os.replace(tmp, link)
    b.prepare_plugin_loading(be, libs)
"""


def test_two_processes_create_the_rtx_link_at_once(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    libs = tmp_path / "tensorrt_rtx_libs"
    libs.mkdir()
    (libs / "libtensorrt_rtx.so.1").write_bytes(os.urandom(64))
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(libs)], stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert all("Traceback" not in e for e in errs), errs
    link = libs / "libtensorrt_rtx.so"
    assert link.is_symlink() and os.readlink(link) == "libtensorrt_rtx.so.1"
    assert sorted(p.name for p in libs.iterdir()) == ["libtensorrt_rtx.so", "libtensorrt_rtx.so.1"]  # no temporaries


def test_simulate_json_is_strict_json_with_null(cli, tmp_path: Path) -> None:
    """Every request rejected (prompt above max_position_embeddings): the TTFT percentiles have no value. JSON has
    no NaN: both the printed summary and --json say null."""
    import json

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1000000, "output_length": 4, "hash_ids": []}\n')

    def strict(text: str) -> dict:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))

    res = cli("simulate", "--trace", trace, "--profile", "a100", "--model", "llama-3.1-8b", "--policy",
              "cache-aware", "--json", tmp_path / "s.json")
    assert res.code == 0, res.err
    printed, saved = strict(res.out), strict((tmp_path / "s.json").read_text())
    assert printed["rejected"] == 1 and printed["ttft_p50_s"] is None and saved["ttft_p50_s"] is None
