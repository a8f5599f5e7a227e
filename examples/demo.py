"""``trtforge demo``: the whole pipeline on the bundled example model, every step through the real command.

Steps (each output kept under the work folder, numbered in pipeline order):

  00_model     example Llama (fp32 and fp16-autocast) and its HF config.json
  01_fold      trtforge fold --check on both variants (report JSON; exactness proven on random inputs)
  02_precision trtforge precision --to fp16 (diffed against fp32) and --to bf16
  03_lora      trtforge lora inject (q_proj, v_proj) into the fp32, fp16 and bf16 models; lora decompose (fp32)
  04_engines   trtforge build: a10 from fp16+LoRA, a100 from bf16+LoRA (TensorRT-RTX on a CPU), and a plugin-free
               a100 engine for Triton
  05_triton    trtforge triton (the plugin engine is refused with its reason; the plain one is written and checked)
  06_diff      original vs folded (atol = rtol = 0) and inject+decompose with every slot -1 vs original (exact)
  07_kv        trtforge kv-plan (h100 with Llama-3.1-8B, a100 with the example model's config)
  08_sim       trtforge simulate on a synthetic trace, three policies, with the cache-aware run's plot

Plan and doing are split: ``plan_steps`` is pure data (name, argv); ``run_demo`` runs them and collects a summary.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StepResult:
    name: str
    status: str  # "ok" | "failed" | "refused (expected)"
    seconds: float
    detail: str
    outputs: list[str] = field(default_factory=list)


def _cli(argv: list[str]) -> int:
    from trtforge.build_engine.cli import main

    try:
        return main(argv)
    except Exception as exc:  # a step's crash is recorded as a failed step; the others still run
        print(f"error: {type(exc).__name__}: {exc}")
        return 1


def plan_steps(work: Path) -> list[tuple[str, list[str]]]:
    """The pipeline as data: (step name, trtforge argv)."""
    m, f, p, lo, e, t, d, k, s = (work / n for n in ("00_model", "01_fold", "02_precision", "03_lora", "04_engines",
                                                   "05_triton", "06_diff", "07_kv", "08_sim"))
    return [
        ("fold fp16-autocast", ["fold", str(m / "llama_fp16_autocast.onnx"), "-o", str(f / "folded_fp16.onnx"),
                                "--report", str(f / "report_fp16.json"), "--check"]),
        ("fold fp32", ["fold", str(m / "llama_fp32.onnx"), "-o", str(f / "folded_fp32.onnx"),
                       "--report", str(f / "report_fp32.json"), "--check"]),
        ("precision fp16", ["precision", str(f / "folded_fp32.onnx"), "-o", str(p / "model_fp16.onnx"),
                            "--to", "fp16", "--report", str(p / "report_fp16.json")]),
        ("diff fp16 vs fp32", ["diff", str(p / "model_fp16.onnx"), str(f / "folded_fp32.onnx"), "--precision",
                               "fp16", "--save", str(p / "diff_fp16.json")]),
        ("precision bf16", ["precision", str(f / "folded_fp32.onnx"), "-o", str(p / "model_bf16.onnx"),
                            "--to", "bf16", "--report", str(p / "report_bf16.json")]),
        *[(f"lora inject {dt}", ["lora", "inject", str(src), "-o", str(lo / f"lora_{dt}.onnx"), "--targets",
                                 "q_proj,v_proj", "--max-rank", "16", "--slots", "8"])
          for dt, src in (("fp32", f / "folded_fp32.onnx"), ("fp16", p / "model_fp16.onnx"),
                          ("bf16", p / "model_bf16.onnx"))],
        ("lora decompose", ["lora", "decompose", str(lo / "lora_fp32.onnx"), "-o",
                            str(lo / "lora_fp32_decomposed.onnx")]),
        ("build a10 (fp16 + LoRA)", ["build", str(lo / "lora_fp16.onnx"), "--profile", "a10", "-o", str(e / "a10"),
                                     "--force", "--no-progress"]),
        ("build a100 (bf16 + LoRA)", ["build", str(lo / "lora_bf16.onnx"), "--profile", "a100", "-o",
                                      str(e / "a100"), "--force", "--no-progress"]),
        ("build a100 (bf16, no plugin)", ["build", str(p / "model_bf16.onnx"), "--profile", "a100", "-o",
                                          str(e / "a100_plain"), "--force", "--no-progress"]),
        ("triton (LoRA engine)", ["triton", str(e / "a100"), "--repo", str(t), "--name", "llama_lora", "--force"]),
        ("triton (plain engine)", ["triton", str(e / "a100_plain"), "--repo", str(t), "--name", "llama_tiny",
                                   "--max-batch", "8", "--force"]),
        ("triton --check", ["triton", "--check", str(t / "llama_tiny")]),
        ("diff original vs folded", ["diff", str(m / "llama_fp32.onnx"), str(f / "folded_fp32.onnx"), "--atol", "0",
                                     "--rtol", "0", "--save", str(d / "fold.json")]),
        ("diff inject+decompose (slots -1) vs original", ["diff", str(lo / "lora_fp32_decomposed.onnx"),
                                                          str(m / "llama_fp32.onnx"), "--extra-inputs", "--value",
                                                          "lora_slot_ids=-1", "--atol", "0", "--rtol", "0",
                                                          "--save", str(d / "lora_off.json")]),
        ("kv-plan h100 llama-3.1-8b", ["kv-plan", "--profile", "h100", "--model", "llama-3.1-8b", "--json",
                                       str(k / "h100_llama-3.1-8b.json")]),
        ("kv-plan a100 example", ["kv-plan", "--profile", "a100", "--model", str(m / "config.json"), "--json",
                                  str(k / "a100_example.json")]),
        *[(f"simulate {pol}", ["simulate", "--trace", "synthetic", "--profile", "h100", "--model", "llama-3.1-8b",
                               "--policy", pol, "--time-scale", "3", "--json", str(s / f"{pol}.json")]
                               + (["--plot", str(s / f"{pol}.png")] if pol == "cache-aware" else []))
          for pol in ("fcfs-no-evict", "max-utilization", "cache-aware")],
    ]


# Steps that are expected to be refused (exit 2) and why: the demo shows the refusal instead of failing.
# (text the error line must contain, what the summary says)
EXPECTED_REFUSALS = {"triton (LoRA engine)": ("plugin", "Triton's TensorRT backend cannot load a Python plugin")}


class _Tee(io.StringIO):
    """Captures what a step writes to stderr while still showing it."""

    def __init__(self, target: Any) -> None:
        super().__init__()
        self._target = target

    def write(self, s: str) -> int:
        self._target.write(s)
        return super().write(s)


def _load_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _detail(name: str, argv: list[str]) -> tuple[str, list[str]]:
    """A one-line summary of a finished step, read from the files it wrote (never from the plan)."""
    outs = [a for i, a in enumerate(argv) if i > 0 and argv[i - 1] in ("-o", "--report", "--json", "--save",
                                                                        "--plot", "--repo")]
    if argv[0] == "fold":
        r = _load_json(Path(argv[argv.index("--report") + 1]))
        rm = r.get("removed", {})
        chk = r.get("check", {})
        return (f"{r.get('nodes_before')} -> {r.get('nodes_after')} nodes; removed Cast {rm.get('Cast', 0)}, "
                f"Identity {rm.get('Identity', 0)}; exact check {'passed' if chk.get('passed') else 'FAILED'} "
                f"(max abs diff {chk.get('max_abs_diff')})", outs)
    if argv[0] == "precision":
        r = _load_json(Path(argv[argv.index("--report") + 1]))
        return (f"{r.get('nodes_low')} ops in {r.get('to')}, {r.get('nodes_fp32')} kept in fp32, "
                f"{r.get('casts_inserted')} Casts inserted, {r.get('initializers_converted')} weights converted", outs)
    if argv[0] == "lora" and argv[1] == "inject":
        from trtforge.build_engine.core.onnx_io import load_model
        from trtforge.plugins.lora import spec

        g = load_model(argv[argv.index("-o") + 1], check=False).graph
        n = sum(1 for node in g.node if node.op_type == spec.PLUGIN_NAME)
        return f"{n} {spec.PLUGIN_NAME} nodes, {len(g.input)} graph inputs", outs
    if argv[0] == "build":
        man = _load_json(Path(argv[argv.index("-o") + 1]) / "manifest.json")
        plan = Path(argv[argv.index("-o") + 1]) / "model.plan"
        size = _fmt_bytes(plan.stat().st_size) if plan.exists() else "?"
        plugins = ", ".join(p["name"] for p in man.get("plugins", [])) or "none"
        return (f"{man.get('backend', {}).get('name')} sm {','.join(man.get('compute_capabilities', []))}, "
                f"{man.get('precision')}, plan {size}, plugins {plugins}, {man.get('build_seconds', 0):.1f} s", outs)
    if argv[0] == "diff":
        acc = _load_json(Path(argv[argv.index("--save") + 1]).with_suffix(".summary.json"))
        rows = acc.get("outputs", [])
        if isinstance(rows, list) and rows:
            worst_abs = max(float(r.get("max_abs", 0.0)) for r in rows)
            worst_rel = max(float(r.get("rel_to_scale", 0.0)) for r in rows)
            mism = sum(int(r.get("mismatches", 0)) for r in rows)
            tol = f"atol {acc.get('atol')}, rtol {acc.get('rtol')}"
            return (f"max abs diff {worst_abs:.3g} ({worst_rel:.2g} of output scale), {mism} mismatches "
                    f"at {tol}", outs)
        return "compared (see saved JSON)", outs
    if argv[0] == "kv-plan":
        k = _load_json(Path(argv[argv.index("--json") + 1]))
        return (f"{k.get('kv_bytes_per_token')} B/token, {k.get('num_blocks')} blocks x {k.get('tokens_per_block')} "
                f"tokens = {k.get('max_tokens')} tokens", outs)
    if argv[0] == "simulate":
        s = _load_json(Path(argv[argv.index("--json") + 1]))
        return (f"{s.get('completed')}/{s.get('requests')} done, {s.get('rejected')} rejected, "
                f"{s.get('preempted')} preempted, {s.get('throughput_tok_s', 0):.0f} tok/s, TTFT p50 "
                f"{s.get('ttft_p50_s', 0):.1f} s / p99 {s.get('ttft_p99_s', 0):.0f} s, prefix hits "
                f"{s.get('prefix_hit_rate', 0):.0%}", outs)
    if argv[0] == "triton" and "--repo" in argv:
        return f"{argv[argv.index('--repo') + 1]}/{argv[argv.index('--name') + 1]}", outs
    if argv[0] == "triton":
        return "config.pbtxt parses with tritonclient's ModelConfig; dims, profiles and plan sha256 match", outs
    return "", outs


def _make_example(work: Path) -> None:
    from .make_example import write_example

    write_example(work / "00_model")


def run_demo(work: Path, echo: Callable[[str], None] = print) -> list[StepResult]:
    """Run every step; a failing step is recorded and the next ones still run where they can."""
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("00_model", "01_fold", "02_precision", "03_lora", "04_engines", "05_triton", "06_diff", "07_kv",
                "08_sim"):
        (work / sub).mkdir(exist_ok=True)
    results: list[StepResult] = []

    def python_step(name: str, fn: Callable[[Path], None], outputs: list[str]) -> None:
        echo(f"\n== {name}")
        t0 = time.perf_counter()
        try:
            fn(work)
            results.append(StepResult(name, "ok", time.perf_counter() - t0, "", outputs))
        except Exception as exc:  # recorded in the summary; the demo exits 1
            results.append(StepResult(name, "failed", time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"))

    python_step("example model", _make_example, [str(work / "00_model")])
    for name, argv in plan_steps(work):
        echo(f"\n== {name}: trtforge {' '.join(argv)}")
        t0 = time.perf_counter()
        err = _Tee(sys.stderr)
        with contextlib.redirect_stderr(err):
            code = _cli(argv)
        secs = time.perf_counter() - t0
        if code == 0:
            detail, outs = _detail(name, argv)
            results.append(StepResult(name, "ok", secs, detail, outs))
        elif name in EXPECTED_REFUSALS and code == 2 and EXPECTED_REFUSALS[name][0] in err.getvalue():
            results.append(StepResult(name, "refused (expected)", secs, EXPECTED_REFUSALS[name][1]))
        else:
            results.append(StepResult(name, "failed", secs, f"exit {code}"))
    return results


def write_summary(work: Path, results: list[StepResult]) -> str:
    """summary.json and summary.md in the work folder; returns the markdown table."""
    from trtforge.build_engine.core.fsutil import write_json, write_text

    rows = ["| step | status | seconds | result |", "|---|---|---:|---|"]
    rows += [f"| {r.name} | {r.status} | {r.seconds:.1f} | {r.detail} |" for r in results]
    table = "\n".join(rows) + "\n"
    write_json(work / "summary.json", [r.__dict__ for r in results])
    write_text(work / "summary.md", table)
    return table
