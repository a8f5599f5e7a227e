"""Discrete-event replay of a request trace against one or more scheduler replicas.

Each replica runs steps back to back while it has work; a step's duration comes from the ``StepTimeModel``.
Arrivals are routed at their arrival time (``round-robin``, or ``prefix-affinity``: the replica whose prefix
cache holds the longest prefix of the request, among replicas that are not overloaded -- load within 1.25x + 8
requests of the least loaded -- so a prefix every request shares, such as a system prompt, does not pile all
traffic onto one replica; no cached prefix anywhere -> the least loaded).

The run is bounded: a replica whose queue cannot move (``fcfs-no-evict`` with a never-fit request at its head)
stops at once, and no replica runs past the last arrival + ``horizon_s``. Requests still queued or running then
are reported as ``stuck``; their TTFT counts as at least (end of run - arrival) in the TTFT percentiles, so a
stalled policy is not flattered by leaving them out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trtforge.build_engine.core.errors import InputError

from ..prefix_cache import block_keys
from ..request import Request
from ..scheduler import Scheduler
from .step_time import StepTimeModel

ROUTERS = ("round-robin", "prefix-affinity")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method); NaN for no values."""
    if not values:
        return math.nan
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass
class _Replica:
    sched: Scheduler
    clock: float = 0.0
    stalled: bool = False
    busy_time: float = 0.0
    used_time: float = 0.0  # integral of used-block fraction over busy time

    def now(self) -> float:
        """This replica's simulated clock (the scheduler's queue-wait metrics read it)."""
        return self.clock

    def has_work(self) -> bool:
        return not self.stalled and bool(self.sched.running or self.sched.queue)


@dataclass(frozen=True)
class SimSummary:
    """What one replay measured (times in simulated seconds; NaN where there was nothing to measure)."""

    policy: str
    replicas: int
    requests: int
    completed: int
    rejected: int
    rejected_by_kind: dict[str, int]  # rejection kind -> count
    preempted: int
    stuck: int  # still queued or running when the run stopped
    stuck_ids: tuple[str, ...]  # the first 20 of them
    duration_s: float
    req_per_s: float
    throughput_tok_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    kv_utilization_mean: float
    prefix_hit_rate: float
    steps: int
    num_blocks_per_replica: int
    tokens_per_block: int

    def to_json(self) -> dict[str, Any]:
        """The ``trtforge simulate --json`` keys, in field order; NaN becomes ``null`` (strict JSON)."""
        out = asdict(self)
        out["stuck_ids"] = list(self.stuck_ids)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


@dataclass(frozen=True)
class SimResult:
    summary: SimSummary
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (time, kv used fraction, queued)
    ttfts: list[float] = field(default_factory=list)


def _route(router: str, reps: list[_Replica], req: Request, rr: int) -> int:
    if router == "round-robin" or len(reps) == 1:
        return rr % len(reps)
    loads = [len(r.sched.queue) + len(r.sched.running) for r in reps]
    bound = min(loads) * 1.25 + 8
    best, best_key = 0, (-1, 0)
    tpb = reps[0].sched.config.tokens_per_block
    keys = block_keys(req, tpb)
    for i, r in enumerate(reps):
        if loads[i] > bound:
            continue
        hit = len(r.sched.cache.match(keys)[0]) if keys else 0
        key = (hit, -loads[i])
        if key > best_key:
            best, best_key = i, key
    return best


def simulate(requests: Sequence[Request], make_scheduler: Callable[[], Scheduler], model: StepTimeModel, *,
             replicas: int = 1, router: str = "round-robin", horizon_s: float = 600.0,
             max_samples: int = 20000) -> SimResult:
    if router not in ROUTERS:
        raise InputError(f"unknown router {router!r}; use one of {', '.join(ROUTERS)}")
    if replicas < 1:
        raise InputError(f"--replicas must be >= 1, got {replicas}")
    reqs = sorted(requests, key=lambda r: r.arrival)
    if not reqs:
        raise InputError("the trace holds no requests")
    reps = [_Replica(make_scheduler()) for _ in range(replicas)]
    t_start = reqs[0].arrival
    for r in reps:
        r.clock = t_start
        r.sched.clock = r.now  # queue-wait metrics in simulated seconds
    deadline = reqs[-1].arrival + horizon_s
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    rejected: dict[str, str] = {}
    where: dict[str, int] = {}
    samples: list[tuple[float, float, int]] = []
    total_blocks = sum(r.sched.config.num_blocks for r in reps)
    steps = 0
    i = 0
    while True:
        t_arr = reqs[i].arrival if i < len(reqs) else math.inf
        active = [r for r in reps if r.has_work() and r.clock < deadline]
        rep = min(active, key=lambda r: r.clock) if active else None
        if rep is None and t_arr == math.inf:
            break
        if rep is None or t_arr <= rep.clock:
            req = reqs[i]
            k = _route(router, reps, req, i)
            target = reps[k]
            if not target.has_work():
                target.clock = max(target.clock, t_arr)
            target.stalled = False
            res = target.sched.submit(req)
            where[req.id] = k
            if res.status == "rejected" and res.reason is not None:
                rejected[req.id] = res.reason.kind
            i += 1
            continue
        s = rep.sched
        plan = s.step()
        steps += 1
        if plan.num_tokens == 0:
            if not s.running:  # nothing running and the queue head cannot be admitted: it never will be
                rep.stalled = True
            continue
        t = plan.step
        seqs = s.seqs
        dec_sum = 0
        for rid in plan.decode:
            q = seqs[rid]
            dec_sum += q.req.prompt_tokens + q.gen_base + (t - 1 - q.dec_base)
        dt = model.step_seconds([(start, n) for _, start, n in plan.context], dec_sum, len(plan.decode))
        rep.clock += dt
        frac = s.used_blocks / s.config.num_blocks
        rep.busy_time += dt
        rep.used_time += frac * dt
        for rid in plan.first_token:
            first[rid] = rep.clock
        for rid in plan.finished:
            done[rid] = rep.clock
        if len(samples) < max_samples:
            used = sum(r.sched.used_blocks for r in reps)
            samples.append((rep.clock - t_start, used / total_blocks, sum(len(r.sched.queue) for r in reps)))
    end = max([r.clock for r in reps] + [reqs[-1].arrival])
    return SimResult(_summarize(reqs, reps, first, done, rejected, end, t_start, steps), samples,
                     sorted(first[r.id] - r.arrival for r in reqs if r.id in first))


def _summarize(reqs: Sequence[Request], reps: list[_Replica], first: dict[str, float], done: dict[str, float],
               rejected: dict[str, str], end: float, t_start: float, steps: int) -> SimSummary:
    by_id = {r.id: r for r in reqs}
    stuck = [r.id for r in reqs if r.id not in done and r.id not in rejected]
    ttft = [first[r.id] - r.arrival if r.id in first else end - r.arrival for r in reqs if r.id not in rejected]
    tpot = [(done[rid] - first[rid]) / (by_id[rid].max_new_tokens - 1) for rid in done
            if by_id[rid].max_new_tokens > 1 and rid in first]
    finish_end = max(done.values(), default=t_start)
    duration = max(finish_end - t_start, 1e-9)
    out_tokens = sum(by_id[rid].max_new_tokens for rid in done)
    hits = sum(r.sched.cache.hits for r in reps)
    queries = sum(r.sched.cache.queries for r in reps)
    busy = sum(r.busy_time for r in reps)
    kinds: dict[str, int] = {}
    for k in rejected.values():
        kinds[k] = kinds.get(k, 0) + 1
    return SimSummary(
        policy=reps[0].sched.policy.name, replicas=len(reps), requests=len(reqs),
        completed=len(done), rejected=len(rejected), rejected_by_kind=kinds,
        preempted=sum(r.sched.counts["preempted"] for r in reps), stuck=len(stuck),
        stuck_ids=tuple(stuck[:20]), duration_s=duration, req_per_s=len(done) / duration,
        throughput_tok_s=out_tokens / duration, ttft_p50_s=percentile(ttft, 50),
        ttft_p99_s=percentile(ttft, 99), tpot_p50_s=percentile(tpot, 50),
        kv_utilization_mean=sum(r.used_time for r in reps) / busy if busy else 0.0,
        prefix_hit_rate=hits / queries if queries else 0.0, steps=steps,
        num_blocks_per_replica=reps[0].sched.config.num_blocks,
        tokens_per_block=reps[0].sched.config.tokens_per_block,
    )


def calibrate(profile: Any, max_running: int = 512, token_budget: int = 8192) -> dict[str, Any]:
    """Replay ``step_time.CALIBRATION`` (an offline trtllm-bench run) and return model / published throughput."""
    from ..kv_plan import PRESETS, plan_kv
    from ..scheduler import SchedulerConfig
    from .step_time import CALIBRATION

    c = CALIBRATION
    spec = PRESETS[str(c["model"])]
    plan = plan_kv(profile, spec, weights_dtype=str(c["weights"]), kv_dtype=str(c["kv_dtype"]),
                   max_num_tokens=token_budget, max_batch=max_running)
    model = StepTimeModel.from_profile(profile, spec, weights_dtype=str(c["weights"]), kv_dtype=str(c["kv_dtype"]))
    reqs = [Request(f"cal-{k}", 0.0, int(c["isl"]), int(c["osl"])) for k in range(int(c["num_requests"]))]
    cfg = SchedulerConfig(num_blocks=plan.num_blocks, tokens_per_block=plan.tokens_per_block,
                          policy="fcfs-no-evict", token_budget=token_budget, max_running=max_running)
    res = simulate(reqs, lambda: Scheduler(cfg), model).summary
    return {"published_output_tok_s": c["output_tok_s"], "model_output_tok_s": res.throughput_tok_s,
            "ratio_model_over_published": res.throughput_tok_s / float(c["output_tok_s"]),
            "source": c["source"], "setup": f"{c['model']} {c['weights']} weights+KV on {c['gpu']}, "
            f"ISL {c['isl']} / OSL {c['osl']}, {c['num_requests']} requests at once, max batch {max_running}"}
