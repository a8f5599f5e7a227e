"""``trtforge demo``: the whole pipeline on the bundled example model, every step a call into the library.

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
  09_quantize  trtforge quantize int8 and int4-wo (built for a100) and fp8 (built for l40s), each diffed against
               the fp32 model with its preset (top-1 agreement and relative error in the summary)

Plan and doing are split: ``plan_steps`` lists each step's name, the ``trtforge`` command that writes the same
files (shown while running), and its call into the library (``demo_steps``); ``run_demo`` runs them and builds
the summary from the objects the library returned (fold report, precision report, manifest, Triton entry, diff
result, KV plan, simulation summary). This package never imports ``trtforge.build_engine.cli``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from trtforge.build_engine.core.errors import TrtforgeError
from trtforge.build_engine.precision.report import PrecisionReport

from . import demo_steps

_log = logging.getLogger("trtforge.examples.demo")


@dataclass
class StepResult:
    name: str
    status: str  # "ok" | "failed" | "refused (expected)"
    seconds: float
    detail: str
    outputs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]  # the trtforge command that writes the same files (shown; the demo calls ``run``)
    run: Callable[[], Any]  # the library call; returns what the library returned
    describe: Callable[[Any], str]  # one line for the summary, from ``run``'s result


def _step(name: str, argv: Sequence[str | Path], run: Callable[[], Any], describe: Callable[[Any], str]) -> Step:
    return Step(name, tuple(str(a) for a in argv), run, describe)


def plan_steps(work: Path) -> list[Step]:
    """The pipeline: (step name, trtforge argv, library call, summary line)."""
    m, f, p, lo, e, t, d, k, s = (work / n for n in ("00_model", "01_fold", "02_precision", "03_lora", "04_engines",
                                                   "05_triton", "06_diff", "07_kv", "08_sim"))
    steps = [_fold_step(name, m / src, f / dst, f / rep) for name, src, dst, rep in (
        ("fold fp16-autocast", "llama_fp16_autocast.onnx", "folded_fp16.onnx", "report_fp16.json"),
        ("fold fp32", "llama_fp32.onnx", "folded_fp32.onnx", "report_fp32.json"))]
    steps += [_precision_step("fp16", f, p), _diff_step("diff fp16 vs fp32", p / "model_fp16.onnx",
                                                        f / "folded_fp32.onnx", p / "diff_fp16.json",
                                                        precision="fp16"), _precision_step("bf16", f, p)]
    steps += [_inject_step(dt, src, lo) for dt, src in (("fp32", f / "folded_fp32.onnx"),
                                                         ("fp16", p / "model_fp16.onnx"),
                                                         ("bf16", p / "model_bf16.onnx"))]
    steps.append(_step("lora decompose", ["lora", "decompose", lo / "lora_fp32.onnx", "-o",
                                          lo / "lora_fp32_decomposed.onnx"],
                       partial(demo_steps.decompose_file, lo / "lora_fp32.onnx", lo / "lora_fp32_decomposed.onnx"),
                       lambda _: ""))
    steps += [_build_step(name, src, prof, e / out) for name, src, prof, out in (
        ("build a10 (fp16 + LoRA)", lo / "lora_fp16.onnx", "a10", "a10"),
        ("build a100 (bf16 + LoRA)", lo / "lora_bf16.onnx", "a100", "a100"),
        ("build a100 (bf16, no plugin)", p / "model_bf16.onnx", "a100", "a100_plain"))]
    steps += _triton_steps(e, t)
    steps += [_diff_step("diff original vs folded", m / "llama_fp32.onnx", f / "folded_fp32.onnx", d / "fold.json",
                         atol=0, rtol=0),
              _diff_step("diff inject+decompose (slots -1) vs original", lo / "lora_fp32_decomposed.onnx",
                         m / "llama_fp32.onnx", d / "lora_off.json", atol=0, rtol=0, values=("lora_slot_ids=-1",),
                         extra_inputs=True)]
    steps += [_kv_step("kv-plan h100 llama-3.1-8b", "h100", "llama-3.1-8b", k / "h100_llama-3.1-8b.json"),
              _kv_step("kv-plan a100 example", "a100", str(m / "config.json"), k / "a100_example.json")]
    steps += [_sim_step(pol, s) for pol in ("fcfs-no-evict", "max-utilization", "cache-aware")]
    steps += _quantize_steps(f / "folded_fp32.onnx", work / "09_quantize")
    return steps


def _quantize_steps(src: Path, q: Path) -> list[Step]:
    """int8 and int4-wo built for a100 (Ampere has no fp8), fp8 built for l40s (Ada, CC 8.9); each diffed
    against the fp32 source with its preset (top-1 agreement and relative error go into the summary)."""
    steps = []
    for mode, profile in (("int8", "a100"), ("int4-wo", "a100"), ("fp8", "l40s")):
        dst, rep = q / f"model_{mode}.onnx", q / f"report_{mode}.json"
        steps.append(_step(f"quantize {mode}", ["quantize", src, "-o", dst, "--mode", mode, "--report", rep],
                           partial(demo_steps.quantize_file, src, dst, mode, rep), _describe_quantize))
        steps.append(_build_step(f"build {profile} ({mode})", dst, profile, q / f"engine_{mode}_{profile}"))
        steps.append(_diff_step(f"diff {mode} vs fp32", dst, src, q / f"diff_{mode}.json", precision=mode))
    return steps


def _fold_step(name: str, src: Path, dst: Path, report: Path) -> Step:
    return _step(name, ["fold", src, "-o", dst, "--report", report, "--check"],
                 partial(demo_steps.fold_file, src, dst, report), _describe_fold)


def _precision_step(to: str, f: Path, p: Path) -> Step:
    src, dst, rep = f / "folded_fp32.onnx", p / f"model_{to}.onnx", p / f"report_{to}.json"
    return _step(f"precision {to}", ["precision", src, "-o", dst, "--to", to, "--report", rep],
                 partial(demo_steps.convert_file, src, dst, to, rep), _describe_precision)


def _inject_step(dt: str, src: Path, lo: Path) -> Step:
    dst = lo / f"lora_{dt}.onnx"
    return _step(f"lora inject {dt}", ["lora", "inject", src, "-o", dst, "--targets", "q_proj,v_proj", "--max-rank",
                                       "16", "--slots", "8"],
                 partial(demo_steps.inject_file, src, dst, ["q_proj", "v_proj"], 16, 8), _describe_inject)


def _build_step(name: str, src: Path, profile: str, out: Path) -> Step:
    return _step(name, ["build", src, "--profile", profile, "-o", out, "--force", "--no-progress"],
                 partial(demo_steps.build, src, profile, out), lambda man: _describe_build(man, out))


def _triton_steps(e: Path, t: Path) -> list[Step]:
    return [
        _step("triton (LoRA engine)", ["triton", e / "a100", "--repo", t, "--name", "llama_lora", "--force"],
              partial(demo_steps.triton_entry, e / "a100", t, "llama_lora"), lambda r: str(r.model_dir)),
        _step("triton (plain engine)", ["triton", e / "a100_plain", "--repo", t, "--name", "llama_tiny",
                                        "--max-batch", "8", "--force"],
              partial(demo_steps.triton_entry, e / "a100_plain", t, "llama_tiny", 8), lambda r: str(r.model_dir)),
        _step("triton --check", ["triton", "--check", t / "llama_tiny"],
              partial(demo_steps.triton_check, t / "llama_tiny"),
              lambda _: "config.pbtxt parses with tritonclient's ModelConfig; dims, profiles and plan sha256 match"),
    ]


def _diff_step(name: str, a: Path, b: Path, save: Path, *, precision: str = "fp32", atol: float | None = None,
               rtol: float | None = None, values: tuple[str, ...] = (), extra_inputs: bool = False) -> Step:
    argv: list[Any] = ["diff", a, b]
    argv += ["--precision", precision] if precision != "fp32" else []
    argv += ["--extra-inputs"] if extra_inputs else []
    argv += [x for v in values for x in ("--value", v)]
    argv += ["--atol", "0", "--rtol", "0"] if atol == 0 and rtol == 0 else []
    argv += ["--save", save]
    run = partial(demo_steps.diff, a, b, save, precision=precision, atol=atol, rtol=rtol, values=values,
                  extra_inputs=extra_inputs)
    return _step(name, argv, run, _describe_diff)


def _kv_step(name: str, profile: str, model: str, out: Path) -> Step:
    return _step(name, ["kv-plan", "--profile", profile, "--model", model, "--json", out],
                 partial(demo_steps.kv_plan, profile, model, out), _describe_kv)


def _sim_step(policy: str, s: Path) -> Step:
    plot = s / f"{policy}.png" if policy == "cache-aware" else None
    argv: list[Any] = ["simulate", "--trace", "synthetic", "--profile", "h100", "--model", "llama-3.1-8b", "--policy",
                       policy, "--time-scale", "3", "--json", s / f"{policy}.json"]
    argv += ["--plot", plot] if plot is not None else []
    return _step(f"simulate {policy}", argv, partial(demo_steps.simulate, policy, s / f"{policy}.json", plot),
                 _describe_sim)


# Steps that are expected to be refused (exit 2) and why: the demo shows the refusal instead of failing.
# (text the error line must contain, what the summary says)
EXPECTED_REFUSALS = {"triton (LoRA engine)": ("plugin", "Triton's TensorRT backend cannot load a Python plugin")}


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _outputs(argv: tuple[str, ...]) -> list[str]:
    return [a for i, a in enumerate(argv) if i > 0 and argv[i - 1] in ("-o", "--report", "--json", "--save",
                                                                        "--plot", "--repo")]


# One line per step for the summary, from the object the library returned.
def _describe_fold(r: demo_steps.Folded) -> str:
    rm = r.report.removed
    return (f"{r.report.nodes_before} -> {r.report.nodes_after} nodes; removed Cast {rm.get('Cast', 0)}, "
            f"Identity {rm.get('Identity', 0)}; exact check {'passed' if r.check.passed else 'FAILED'} "
            f"(max abs diff {r.check.max_abs_diff})")


def _describe_precision(r: PrecisionReport) -> str:
    return (f"{r.nodes_low} ops in {r.to}, {r.nodes_fp32} kept in fp32, {r.casts_inserted} Casts inserted, "
            f"{r.initializers_converted} weights converted")


def _describe_inject(model: Any) -> str:
    from trtforge.plugins.lora import spec

    n = sum(1 for node in model.graph.node if spec.is_lora_node(node))
    return f"{n} {spec.PLUGIN_NAME} nodes, {len(model.graph.input)} graph inputs"


def _describe_build(man: Any, out: Path) -> str:
    plan = out / man.plan
    size = _fmt_bytes(plan.stat().st_size) if plan.exists() else "?"
    plugins = ", ".join(p.name for p in man.plugins) or "none"
    return (f"{man.backend.name} sm {','.join(man.compute_capabilities)}, {man.precision}, plan {size}, "
            f"plugins {plugins}, {man.build_seconds:.1f} s")


def _describe_quantize(r: Any) -> str:
    return (f"{len(r.nodes)} projections {r.mode}, {len(r.excluded)} kept float "
            f"({', '.join(e.name for e in r.excluded)}), {r.seconds:.1f} s")


def _describe_diff(res: Any) -> str:
    if not res.outputs:
        return "compared (see saved JSON)"
    if any(o.top1 is not None for o in res.outputs) and res.atol >= 1e29:  # a quantized preset
        return "; ".join(f"{o.name}: top-1 agreement {o.top1:.3f}, relative error {o.rel_error:.4f}"
                         for o in res.outputs if o.top1 is not None)
    worst_abs = max(o.max_abs for o in res.outputs)
    worst_rel = max(o.rel_to_scale for o in res.outputs)
    mism = sum(o.mismatches for o in res.outputs)
    return (f"max abs diff {worst_abs:.3g} ({worst_rel:.2g} of output scale), {mism} mismatches at atol {res.atol}, "
            f"rtol {res.rtol}")


def _describe_kv(k: Any) -> str:
    return (f"{k.kv_bytes_per_token} B/token, {k.num_blocks} blocks x {k.tokens_per_block} tokens = {k.max_tokens} "
            "tokens")


def _describe_sim(s: Any) -> str:
    return (f"{s.completed}/{s.requests} done, {s.rejected} rejected, {s.preempted} preempted, "
            f"{s.throughput_tok_s:.0f} tok/s, TTFT p50 {s.ttft_p50_s:.1f} s / p99 {s.ttft_p99_s:.0f} s, prefix hits "
            f"{s.prefix_hit_rate:.0%}")


def _make_example(work: Path) -> None:
    from .make_example import write_example

    write_example(work / "00_model")


def run_demo(work: Path, echo: Callable[[str], None] = print) -> list[StepResult]:
    """Run every step; a failing step is recorded and the next ones still run where they can."""
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("00_model", "01_fold", "02_precision", "03_lora", "04_engines", "05_triton", "06_diff", "07_kv",
                "08_sim", "09_quantize"):
        (work / sub).mkdir(exist_ok=True)
    results: list[StepResult] = []

    def python_step(name: str, fn: Callable[[Path], None], outputs: list[str]) -> None:
        echo(f"\n== {name}")
        t0 = time.perf_counter()
        try:
            fn(work)
            results.append(StepResult(name, "ok", time.perf_counter() - t0, "", outputs))
        except Exception as exc:  # recorded in the summary and said on stderr, as a command step's; the demo exits 1
            _log.error("%s: %s: %s", name, type(exc).__name__, exc)  # the cause (a full disk) of the errors after
            results.append(StepResult(name, "failed", time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"))

    python_step("example model", _make_example, [str(work / "00_model")])
    for step in plan_steps(work):
        echo(f"\n== {step.name}: trtforge {' '.join(step.argv)}")
        t0 = time.perf_counter()
        try:
            value = step.run()
        except TrtforgeError as exc:
            secs = time.perf_counter() - t0
            refusal = EXPECTED_REFUSALS.get(step.name)
            if refusal is not None and exc.exit_code == 2 and refusal[0] in exc.message:
                # Not an error of the demo: shown as what it is, so a successful run prints no 'error:' line.
                echo(f"   refused (expected): {exc.message}")
                results.append(StepResult(step.name, "refused (expected)", secs, refusal[1]))
            else:
                _log.error("%s", exc.message)
                results.append(StepResult(step.name, "failed", secs, f"exit {exc.exit_code}"))
            continue
        except Exception as exc:  # a step's crash is recorded as a failed step; the others still run
            _log.error("%s: %s", type(exc).__name__, exc)
            results.append(StepResult(step.name, "failed", time.perf_counter() - t0, "exit 1"))
            continue
        secs = time.perf_counter() - t0
        detail = step.describe(value)
        echo(f"   {detail}" if detail else "   done")
        results.append(StepResult(step.name, "ok", secs, detail, _outputs(step.argv)))
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
