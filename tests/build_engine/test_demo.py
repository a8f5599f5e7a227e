"""trtforge demo end to end: every step calls the library, writes what its command writes, and keeps its output."""

from __future__ import annotations

import ast
import json
from pathlib import Path


def test_demo_runs_every_step_and_keeps_outputs(cli, tmp_path: Path) -> None:
    work = tmp_path / "demo"
    res = cli("demo", "--workdir", work)
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]
    steps = json.loads((work / "summary.json").read_text())
    status = {s["name"]: s["status"] for s in steps}
    assert status.pop("triton (LoRA engine)") == "refused (expected)"
    # The expected refusal is shown as such, not as an error line (issue 11).
    assert "refused (expected)" in res.out and "error:" not in res.err, res.err[-2000:]
    assert set(status.values()) == {"ok"}, status
    # The two exactness claims of the demo, read back from the diff summaries it saved.
    for name in ("fold", "lora_off"):
        summary = json.loads((work / "06_diff" / f"{name}.summary.json").read_text())
        assert summary["passed"] and summary["atol"] == 0 and summary["rtol"] == 0
        assert all(o["max_abs"] == 0 and o["mismatches"] == 0 for o in summary["outputs"])
    for engine in ("a10", "a100", "a100_plain"):
        manifest = json.loads((work / "04_engines" / engine / "manifest.json").read_text())
        assert (work / "04_engines" / engine / "model.plan").stat().st_size > 100_000
        assert manifest["compute_capabilities"] == (["8.6"] if engine == "a10" else ["8.0"])
    assert (work / "05_triton" / "llama_tiny" / "config.pbtxt").is_file()
    assert not (work / "05_triton" / "llama_lora").exists()
    assert (work / "08_sim" / "cache-aware.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sims = {p: json.loads((work / "08_sim" / f"{p}.json").read_text())
            for p in ("fcfs-no-evict", "max-utilization", "cache-aware")}
    assert sims["cache-aware"]["preempted"] == 0
    assert "| simulate cache-aware | ok |" in (work / "summary.md").read_text()
    # Quantization: int8 and int4-wo engines for a100, fp8 for l40s, each with its accuracy line.
    for mode, profile, cc in (("int8", "a100", "8.0"), ("int4-wo", "a100", "8.0"), ("fp8", "l40s", "8.9")):
        manifest = json.loads((work / "09_quantize" / f"engine_{mode}_{profile}" / "manifest.json").read_text())
        assert manifest["precision"] == mode and manifest["compute_capabilities"] == [cc]
        assert manifest["quantization"]["mode"] == mode
        line = next(s["detail"] for s in steps if s["name"] == f"diff {mode} vs fp32")
        assert line.startswith("logits: top-1 agreement ") and "relative error" in line


def test_examples_never_import_the_cli() -> None:
    """cli imports examples (trtforge demo); the demo calls library functions, never the commands."""
    folder = Path(__file__).resolve().parents[2] / "examples"
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any("cli" in n.split(".") for n in names), (path.name, names)


def test_plan_lists_the_commands_and_library_calls(tmp_path: Path) -> None:
    from trtforge.examples.demo import EXPECTED_REFUSALS, plan_steps

    steps = plan_steps(tmp_path)
    assert len(steps) == 31 and len({s.name for s in steps}) == 31
    assert set(EXPECTED_REFUSALS) <= {s.name for s in steps}
    assert all(s.argv[0] in {"fold", "precision", "quantize", "lora", "build", "triton", "diff", "kv-plan", "simulate"}
               and callable(s.run) for s in steps)
