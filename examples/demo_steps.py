"""The demo's steps as library calls: each writes the files the ``trtforge`` command shown beside it in the demo
writes, and returns what the library returned (fold report and check, precision report, injected model, manifest,
Triton entry, diff result, KV plan, simulation summary), from which ``demo.py`` builds its summary table.

Options the demo does not pass keep the commands' defaults (``trtforge fold --seed 0``, ``trtforge simulate
--max-running 256 --token-budget 8192 --horizon 600``...), so the files are the ones the commands would write.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtforge.build_engine.core import fsutil, onnx_io, onnx_save
from trtforge.build_engine.core.errors import CheckFailed

if TYPE_CHECKING:  # pragma: no cover
    from trtforge.build_engine.engine.manifest import Manifest
    from trtforge.build_engine.passes.report import FoldReport
    from trtforge.build_engine.precision.report import PrecisionReport
    from trtforge.build_engine.triton.repo import EntryReport
    from trtforge.build_engine.verify.bitwise import CheckResult
    from trtforge.build_engine.verify.diff import DiffResult
    from trtforge.scheduler.kv_plan import KVPlan
    from trtforge.scheduler.sim.simulator import SimSummary


@dataclass(frozen=True)
class Folded:
    """``fold`` then the bitwise check: the fold report and the check's result."""

    report: FoldReport
    check: CheckResult


def fold_file(src: Path, dst: Path, report: Path, seed: int = 0) -> Folded:
    """``trtforge fold SRC -o DST --report REPORT --check``."""
    from trtforge.build_engine.passes import fold
    from trtforge.build_engine.verify.bitwise import check_equivalent

    loaded = onnx_io.load(src)
    result = fold(loaded.model)
    chk = check_equivalent(loaded.model, result.model, seed=seed)
    if chk.passed:  # as the command: a model whose outputs changed is not written; the report is
        onnx_save.save_like(result.model, dst, loaded)
    fsutil.write_json(report, {**result.report.to_json(), "input": str(src), "output": str(dst),
                               "check": chk.as_dict()})
    if not chk.passed:
        raise CheckFailed(f"{src}: folded outputs differ on random inputs ({', '.join(chk.mismatched)})")
    return Folded(result.report, chk)


def convert_file(src: Path, dst: Path, to: str, report: Path) -> PrecisionReport:
    """``trtforge precision SRC -o DST --to TO --report REPORT``; returns the conversion report."""
    from trtforge.build_engine.precision.convert import convert_precision

    loaded = onnx_io.load(src)
    result = convert_precision(loaded.model, to)
    onnx_save.save_like(result.model, dst, loaded)
    fsutil.write_json(report, result.report.to_json())
    return result.report


def inject_file(src: Path, dst: Path, targets: list[str], max_rank: int, slots: int) -> Any:
    """``trtforge lora inject SRC -o DST --targets ... --max-rank R --slots N``; returns the injected model."""
    from trtforge.plugins.lora import spec
    from trtforge.plugins.lora.inject import inject

    loaded = onnx_io.load(src)
    model = inject(loaded.model, targets, max_rank, slots, tile=spec.DEFAULT_TILE)
    onnx_save.save_like(model, dst, loaded)
    return model


def decompose_file(src: Path, dst: Path) -> Any:
    """``trtforge lora decompose SRC -o DST``; returns the plugin-free model."""
    from trtforge.plugins.lora.decompose import decompose

    loaded = onnx_io.load(src)
    model = decompose(loaded.model)
    onnx_save.save_like(model, dst, loaded)
    return model


def quantize_file(src: Path, dst: Path, mode: str, report: Path) -> Any:
    """``trtforge quantize SRC -o DST --mode MODE --report REPORT`` (generated calibration samples, seed 0)."""
    from trtforge.build_engine.quantize import QuantConfig, generate, quantize

    loaded = onnx_io.load(src)
    cfg = QuantConfig(mode=mode)
    result = quantize(loaded.model, cfg, generate(loaded.model, cfg.calib_size, cfg.seq_len, cfg.seed))
    onnx_save.save_like(result.model, dst, loaded)
    fsutil.write_json(report, {**result.report.to_json(), "input": str(src), "output": str(dst)})
    return result.report


def build(src: Path, profile: str, out: Path) -> Manifest:
    """``trtforge build SRC --profile P -o OUT --force --no-progress``."""
    from trtforge.build_engine.engine.builder import build_engine

    return build_engine(src, profile, out, force=True, progress=False)


def triton_entry(engine: Path, repo: Path, name: str, max_batch: int | None = None) -> EntryReport:
    """``trtforge triton ENGINE --repo REPO --name NAME [--max-batch B] --force``."""
    from trtforge.build_engine.triton.repo import write_entry

    return write_entry(engine, repo, name, max_batch=max_batch, force=True)


def triton_check(model_dir: Path) -> EntryReport:
    """``trtforge triton --check REPO/NAME``."""
    from trtforge.build_engine.triton.repo import check_entry

    return check_entry(model_dir)


def diff(a: Path, b: Path, save: Path, *, precision: str = "fp32", atol: float | None = None,
         rtol: float | None = None, values: tuple[str, ...] = (), extra_inputs: bool = False) -> DiffResult:
    """``trtforge diff A B --save SAVE ...``; raises CheckFailed (after saving) when an output differs."""
    from trtforge.build_engine.verify.diff import check, run_diff, save_paths, save_results
    from trtforge.build_engine.verify.inputs import parse_value_args

    save_paths(save, (a, b))
    result = run_diff(a, b, precision=precision, atol=atol, rtol=rtol, seed=0, shapes={},
                      values=parse_value_args(list(values)), extra_inputs=extra_inputs, ort_optimize=False)
    save_results(result, save)
    check(result)
    return result


def kv_plan(profile: str, model: str, out: Path) -> KVPlan:
    """``trtforge kv-plan --profile P --model M --json OUT``."""
    from trtforge.profiles.loader import load_profile
    from trtforge.scheduler.kv_plan import load_model_spec, plan_kv

    plan = plan_kv(load_profile(profile), load_model_spec(model))
    fsutil.write_json(out, plan.to_json())
    return plan


def simulate(policy: str, out: Path, plot: Path | None, *, trace: str = "synthetic", profile: str = "h100",
             model: str = "llama-3.1-8b", time_scale: float = 3.0) -> SimSummary:
    """``trtforge simulate --trace T --profile P --model M --policy POL --time-scale S --json OUT [--plot PNG]``."""
    from trtforge.profiles.loader import load_profile
    from trtforge.scheduler.kv_plan import load_model_spec
    from trtforge.scheduler.kv_plan import plan_kv as plan
    from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
    from trtforge.scheduler.sim.simulator import simulate as replay
    from trtforge.scheduler.sim.step_time import StepTimeModel
    from trtforge.scheduler.sim.traces import load_trace

    prof, spec = load_profile(profile), load_model_spec(model)
    kv = plan(prof, spec, max_num_tokens=8192, max_batch=256)
    reqs = [replace(r, arrival=r.arrival * time_scale) for r in load_trace(trace, None, seed=0)]
    cfg = SchedulerConfig(num_blocks=max(1, math.floor(kv.num_blocks * 1.0)), tokens_per_block=kv.tokens_per_block,
                          policy=policy, max_seq_len=spec.max_position_embeddings, token_budget=8192, max_running=256)
    res = replay(reqs, lambda: Scheduler(cfg), StepTimeModel.from_profile(prof, spec), horizon_s=600.0)
    fsutil.write_json(out, {**res.summary.to_json(), "router": "round-robin", "trace": trace, "profile": prof.name,
                            "model": spec.name, "kv_bytes_per_token": kv.kv_bytes_per_token, "kv_scale": 1.0,
                            "time_scale": time_scale})
    if plot is not None:
        from trtforge.scheduler.sim.plots import plot_results

        plot_results([(f"{policy} x1", res)], plot)
    return res.summary
