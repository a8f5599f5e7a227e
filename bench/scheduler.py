"""Scheduler benchmark: policies on the Mooncake trace, routing, and the cost of one step().

Run: ``python bench/scheduler.py`` (needs ../shared/traces/ for the trace parts; the step-overhead part always
runs). Every number is simulated time from ``StepTimeModel`` (roofline, h100 profile, Llama-3.1-8B bf16) except
the step() overhead, which is wall time on this machine printed against an anchor measured in the same run.

What is scaled (the one-hour Mooncake conversation trace is a cluster's load, and one H100 holds ~464k tokens of
KV for an 8B model, which that trace cannot fill without also saturating compute):
- window: the first 10 minutes of the trace (1,750 requests);
- arrivals stretched by 1.4x (rate / 1.4), replayed on 3 replicas, round-robin;
- KV capacity per replica scaled down to a fraction of ``plan_kv``'s blocks, so requests compete for KV blocks:
  scenario A uses 0.30 (2,176 blocks = 139k tokens; every request of the window fits an empty cache),
  scenario B uses 0.20 (1,451 blocks = 93k tokens; 24 requests of the window can never fit).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS, plan_kv
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.simulator import SimSummary, calibrate, simulate
from trtforge.scheduler.sim.step_time import StepTimeModel
from trtforge.scheduler.sim.traces import read_mooncake_jsonl

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
POLICIES = ("fcfs-no-evict", "max-utilization", "cache-aware")


def _fmt(r: SimSummary) -> str:
    return (f"completed {r.completed:5d}  rejected {r.rejected:3d}  stuck {r.stuck:5d}  preempted "
            f"{r.preempted:3d}  req/s {r.req_per_s:.3f}  ttft p50 {r.ttft_p50_s:7.2f}s p99 "
            f"{r.ttft_p99_s:7.2f}s  tpot p50 {1e3 * r.tpot_p50_s:5.1f}ms  kv {r.kv_utilization_mean:.2f}  "
            f"hit {r.prefix_hit_rate:.3f}")


def policies(reqs: list[Request], blocks: int, model: StepTimeModel, label: str) -> dict[str, SimSummary]:
    print(f"\n[{label}] {len(reqs)} requests, {blocks} blocks/replica x 3 replicas (round-robin)")
    out = {}
    for pol in POLICIES:
        cfg = SchedulerConfig(num_blocks=blocks, tokens_per_block=64, policy=pol)
        t0 = time.perf_counter()
        out[pol] = simulate(reqs, lambda cfg=cfg: Scheduler(cfg), model, replicas=3).summary
        print(f"  {pol:16s} {_fmt(out[pol])}  ({time.perf_counter() - t0:.1f}s wall)")
    f, c = out["fcfs-no-evict"], out["cache-aware"]
    ratio = c.req_per_s / f.req_per_s
    p99 = (c.ttft_p99_s - f.ttft_p99_s) / f.ttft_p99_s
    p50 = (c.ttft_p50_s - f.ttft_p50_s) / f.ttft_p50_s
    print(f"  cache-aware / fcfs-no-evict: completed req/s x{ratio:.2f}, completed {c.completed} vs "
          f"{f.completed}, ttft p99 {100 * p99:+.0f}%, ttft p50 {100 * p50:+.0f}%, cache-aware preemptions "
          f"{c.preempted}, rejections {c.rejected_by_kind or 0}")
    return out


def routing(reqs: list[Request], blocks: int, model: StepTimeModel) -> None:
    print(f"\n[routing] {len(reqs)} requests, cache-aware, 4 replicas x {blocks} blocks")
    rates = {}
    for router in ("round-robin", "prefix-affinity"):
        cfg = SchedulerConfig(num_blocks=blocks, tokens_per_block=64, policy="cache-aware")
        r = simulate(reqs, lambda cfg=cfg: Scheduler(cfg), model, replicas=4, router=router).summary
        rates[router] = r.prefix_hit_rate
        print(f"  {router:16s} {_fmt(r)}")
    print(f"  prefix hit rate prefix-affinity / round-robin: x{rates['prefix-affinity'] / rates['round-robin']:.2f}")


def step_overhead() -> None:
    """step() with 256 running (decoding) and 1,000 queued that do not fit (admission has to look and stop)."""
    print("\n[step overhead] 256 running + 1000 queued, tokens_per_block 64")
    for pol in ("fcfs-no-evict", "cache-aware"):
        for metrics in (False, True):
            need = sum(math.ceil((1000 + k + 1500) / 64) for k in range(256))  # exactly the 256 running ones
            s = Scheduler(SchedulerConfig(num_blocks=need, tokens_per_block=64, policy=pol, max_running=512,
                                          token_budget=8192), metrics=metrics)
            for k in range(256):
                s.submit(Request(f"r{k}", 0.0, 1000 + k, 1500))
            for k in range(1000):
                s.submit(Request(f"q{k}", 0.0, 2000 + k, 500))
            while s.prefilling:  # get everyone into decode
                s.step()
            assert len(s.running) == 256 and len(s.queue) == 1000, (len(s.running), len(s.queue))
            seqs = list(s.seqs.values())
            n = 200
            t0 = time.perf_counter()
            for _ in range(n):
                plan = s.step()
            assert len(plan.decode) == 256 and len(s.queue) == 1000
            per_step = (time.perf_counter() - t0) / n
            t0 = time.perf_counter()
            for _ in range(n):
                total = 0
                for q in seqs:  # anchor: touch each of the 1256 requests once
                    total += q.prompt_len
            anchor = (time.perf_counter() - t0) / n
            print(f"  {pol:14s} metrics={'on ' if metrics else 'off'}  step() {1e6 * per_step:7.1f} us   anchor "
                  f"(one pass over the 1256 requests) {1e6 * anchor:6.1f} us   ratio {per_step / anchor:.2f}")


def main() -> int:
    prof = load_profile("h100")
    spec = PRESETS["llama-3.1-8b"]
    kv = plan_kv(prof, spec)
    model = StepTimeModel.from_profile(prof, spec)
    print(f"h100 + llama-3.1-8b bf16: {kv.num_blocks} KV blocks of {kv.tokens_per_block} tokens "
          f"({kv.max_tokens} tokens), {kv.kv_bytes_per_token} bytes/token")
    cal = calibrate(prof)
    print(f"calibration: {cal['setup']}: model {cal['model_output_tok_s']:.0f} tok/s vs published "
          f"{cal['published_output_tok_s']:.0f} tok/s -> ratio model/published {cal['ratio_model_over_published']:.3f}"
          f" ({cal['source']})")
    path = TRACES / "mooncake_conversation_trace.jsonl"
    if path.exists():
        trace = read_mooncake_jsonl(path)
        window = [replace(r, arrival=r.arrival * 1.4) for r in trace if r.arrival < 600]
        never = sum(math.ceil(r.total_tokens / 64) > int(kv.num_blocks * 0.2) for r in window)
        print(f"window: first 10 min of Mooncake, {len(window)} requests, arrivals x1.4; never-fit at 0.20 KV: {never}")
        policies(window, int(kv.num_blocks * 0.3), model, "A: KV x0.30, every request can fit")
        policies(window, int(kv.num_blocks * 0.2), model, "B: KV x0.20, some requests can never fit")
        routing([r for r in trace if r.arrival < 600], kv.num_blocks, model)
    else:
        print(f"{path} not found: trace benchmarks skipped", file=sys.stderr)
    step_overhead()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
