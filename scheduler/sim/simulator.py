"""Discrete-event replay of a request trace against one or more scheduler replicas.

Each replica runs steps back to back while it has work; a step's duration comes from the ``StepTimeModel``.
Arrivals are routed at their arrival time (``router``: see ``sim.router``).

Only the simulator knows when a request ends. The trace's output length is the truth; the scheduler sees the
client's cap (``max_tokens``): a number N (the request stops at min(N, true length)), ``context`` (the rest of the
model's context, what vLLM and TensorRT-LLM's OpenAI servers use when the client sends no max_tokens) or
``oracle`` (the cap is the true length -- reservation that sees the future, for comparison only). The replay
finishes a request at its end-of-sequence through ``Scheduler.finish``, as an executor would.

The run is bounded: a replica whose queue cannot move (``trtllm-1.2-no-evict`` with a never-fit request at its
head) stops at once, and no replica runs past the last arrival + ``horizon_s``. Every rate is over that one window
(``sim.summary``), for every policy.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import TYPE_CHECKING

from trtforge.build_engine.core.errors import InputError

from ..request import Request
from ..scheduler import Scheduler, StepPlan
from .router import ROUTERS, Router
from .step_time import StepTimeModel
from .summary import Outcome, SimSummary, percentile, summarize

if TYPE_CHECKING:  # pragma: no cover
    from .response_cache import CacheFront

__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_SLO_TPOT_S", "DEFAULT_SLO_TTFT_S", "ROUTERS", "SimResult", "SimSummary",
           "calibrate", "percentile", "simulate"]

# 2048: above the longest output of both bundled traces (Azure 2023 conversation: 1,000; Mooncake conversation:
# 2,000), so the cap never truncates an output and what it measures is the cost of reserving to a cap that a
# client sends without knowing the answer's length; ``context`` is the worst case, ``oracle`` the unreal best.
DEFAULT_MAX_TOKENS = "2048"
# Goodput SLO defaults: TTFT 5 s lets the Mooncake trace's p99 prompt (85k tokens, ~3 s of prefill on one H100 by
# the step model) meet it when it does not queue, so a miss means waiting; TPOT 100 ms is 10 tokens/s, a
# comfortable reading speed for chat.
DEFAULT_SLO_TTFT_S = 5.0
DEFAULT_SLO_TPOT_S = 0.1


@dataclass
class _Replica:
    sched: Scheduler
    clock: float = 0.0
    stalled: bool = False
    busy_time: float = 0.0
    used_time: float = 0.0  # integral of used-block fraction over busy time
    eos: list[tuple[int, int, str]] = field(default_factory=list)  # (step, epoch, request id)

    def now(self) -> float:
        """This replica's simulated clock (the scheduler's queue-wait metrics read it)."""
        return self.clock

    def has_work(self) -> bool:
        return not self.stalled and bool(self.sched.running or self.sched.queue)


@dataclass
class _Samples:
    """The plot's (time, KV used fraction, queued) after steps: at most ``limit``, spread over the whole replay. When
    full, every other sample is dropped and from then on every other due step is sampled (it kept the first
    ``limit``: the full Azure trace's plot stopped at 1,431 s of a 3,504 s replay)."""

    limit: int
    out: list[tuple[float, float, int]] = field(default_factory=list)
    stride: int = 1
    seen: int = 0

    def due(self) -> bool:
        self.seen += 1
        return self.seen % self.stride == 0

    def add(self, sample: tuple[float, float, int]) -> None:
        if len(self.out) >= self.limit:
            if self.limit < 2:
                return
            del self.out[1::2]
            self.stride *= 2
        self.out.append(sample)


@dataclass(frozen=True)
class SimResult:
    summary: SimSummary
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (time, kv used fraction, queued)
    ttfts: list[float] = field(default_factory=list)
    last_completion_s: float = math.nan  # seconds from the first arrival to the last completion


def cap_requests(requests: Sequence[Request], max_tokens: str, max_seq_len: int) -> tuple[list[Request],
                                                                                          dict[str, int]]:
    """(requests as the scheduler sees them, with the cap as ``max_new_tokens``; true output length by id)."""
    if max_tokens not in ("context", "oracle"):
        try:
            n = int(max_tokens)
        except ValueError as exc:
            raise InputError(f"--max-tokens {max_tokens!r}: give a number >= 1, 'context' or 'oracle'") from exc
        if n < 1:
            raise InputError(f"--max-tokens must be >= 1, got {n}")
    out: list[Request] = []
    truth: dict[str, int] = {}
    for r in requests:
        if max_tokens == "oracle":
            cap = r.max_new_tokens
        elif max_tokens == "context":
            cap = max(1, max_seq_len - r.prompt_tokens)
        else:
            cap = n
        truth[r.id] = min(r.max_new_tokens, cap)
        out.append(r if cap == r.max_new_tokens else replace(r, max_new_tokens=cap))
    return out, truth


def submit(rep: _Replica, req: Request, rejected: dict[str, str], delay: float = 0.0) -> None:
    """Hand one arrival to a replica (the one place requests enter a scheduler; a response cache hooks here).
    ``delay``: seconds after its arrival that it reaches the scheduler (a response-cache miss's lookup time; a
    busy replica takes it at its next step, as before)."""
    if not rep.has_work():
        rep.clock = max(rep.clock, req.arrival + delay)
    rep.stalled = False
    res = rep.sched.submit(req)
    if res.status == "rejected" and res.reason is not None:
        rejected[req.id] = res.reason.kind


def _end_of_sequence(rep: _Replica, plan: StepPlan, truth: dict[str, int], done: dict[str, float]) -> None:
    """Requests whose true output is complete after this step stop here (before their cap), after those that
    reached their cap (``Scheduler.update``). They free their blocks in admission order (``Seq.order``), as the
    TensorRT-LLM adapter frees them: the free order is the prefix cache's LRU order, so it decides which cached
    prefixes later requests find (it was: those at their first token first, then by request id as a string)."""
    s, t = rep.sched, plan.step
    ended = []
    for rid in plan.started_decode:
        seq = s.seqs[rid]
        at = seq.dec_base + truth[rid] - seq.gen_base  # generated(at) == true length
        if at <= t:
            ended.append(seq)
        else:
            heapq.heappush(rep.eos, (at, seq.epoch, rid))
    heap = rep.eos
    while heap and heap[0][0] <= t:
        _, epoch, rid = heapq.heappop(heap)
        seq = s.seqs[rid]
        if seq.epoch == epoch and seq.decoding:
            ended.append(seq)
    for seq in sorted(ended, key=lambda q: q.order):
        s.finish(seq.req.id)
        done[seq.req.id] = rep.clock


def _fast_forward(rep: _Replica, model: StepTimeModel, limit: float) -> int:
    """Replay the quiet decode-only steps that follow (``Scheduler.quiet_steps``, bounded by the next
    end-of-sequence) without planning each one, while this replica's clock is before ``limit`` (the next
    arrival or the deadline): exactly the steps, times and clock the step-by-step loop produces, cheaper."""
    s = rep.sched
    k_max = s.quiet_steps()
    if rep.eos:
        k_max = min(k_max, rep.eos[0][0] - s.step_no - 1)
    if k_max <= 0 or rep.clock >= limit:
        return 0
    n = len(s.decoding)
    frac = s.used_blocks / s.config.num_blocks
    t, k, clock = s.step_no, 0, rep.clock
    while k < k_max and clock < limit:
        k += 1
        clock += model.decode_seconds(s.decode_context_sum(t + k), n)
    s.skip(k)
    rep.busy_time += clock - rep.clock
    rep.used_time += frac * (clock - rep.clock)
    rep.clock = clock
    return k


def _step_seconds(model: StepTimeModel, plan: StepPlan) -> float:
    """One step's time from its plan: the prefill chunks, and the decode context as planned
    (``StepPlan.decode_context``; the state after the step counted the requests that just started decoding, whose
    first decode is the next step, and missed those that reached their cap, which decoded in it)."""
    if plan.context:
        return model.step_seconds([(start, n) for _, start, n in plan.context], plan.decode_context,
                                  len(plan.decode))
    # the same function as the quiet steps fast-forwarded, so both give the same clock
    return model.decode_seconds(plan.decode_context, len(plan.decode))


def _replay(reqs: list[Request], reps: list[_Replica], router: Router, model: StepTimeModel, deadline: float,
            truth: dict[str, int], seen: tuple[dict[str, float], dict[str, float], dict[str, str]],
            samples: _Samples, fast_forward: bool, front: CacheFront | None = None) -> int:
    """The event loop: the next arrival or the step of the replica furthest behind; returns the step count."""
    first, done, rejected = seen
    t_start = reqs[0].arrival
    total_blocks = sum(r.sched.config.num_blocks for r in reps)
    steps = 0
    i = 0
    while True:
        t_arr = reqs[i].arrival if i < len(reqs) else math.inf
        rep = None
        for r in reps:
            if r.has_work() and r.clock < deadline and (rep is None or r.clock < rep.clock):
                rep = r
        if rep is None and t_arr == math.inf:
            break
        if rep is None or t_arr <= rep.clock:
            k = router.pick(reqs[i], i)
            served = front.serve(reqs[i], k, t_arr) if front is not None else None
            if served is not None:  # a response-cache hit (response_cache.py) never reaches the scheduler
                first[reqs[i].id] = done[reqs[i].id] = t_arr + served
                router.answered_by_cache(reqs[i], k)  # nor is it load on the replica it was routed to
            else:  # a miss reaches the scheduler after the lookup that missed
                submit(reps[k], reqs[i], rejected, front.miss_seconds(reqs[i].id) if front is not None else 0.0)
            i += 1
            continue
        s = rep.sched
        plan = s.schedule()
        # the blocks held while this step runs: update frees those of requests that reach their cap in it (counted
        # after it, a capped request's last step was not, an end-of-sequence one's was)
        held = s.used_blocks
        s.update(plan)
        steps += 1
        if plan.num_tokens == 0:
            if not s.running:  # nothing running and the queue head cannot be admitted: it never will be
                rep.stalled = True
            continue
        dt = _step_seconds(model, plan)
        rep.clock += dt
        rep.busy_time += dt
        rep.used_time += held / s.config.num_blocks * dt
        n_done = len(done)
        for rid in plan.first_token:
            first[rid] = rep.clock
        for rid in plan.finished:
            done[rid] = rep.clock
        _end_of_sequence(rep, plan, truth, done)
        if front is not None:  # what finished in this step: the last entries of ``done`` (insertion order)
            for rid in plan.first_token:
                front.first_token(rid, rep.clock)
            for rid in islice(reversed(done), len(done) - n_done):
                front.done(rid, rep.clock)
        if fast_forward:
            steps += _fast_forward(rep, model, min(t_arr, deadline))
        if samples.due():
            used = sum(r.sched.used_blocks for r in reps)
            samples.add((rep.clock - t_start, used / total_blocks, sum(len(r.sched.queue) for r in reps)))
    return steps


def simulate(requests: Sequence[Request], make_scheduler: Callable[[], Scheduler], model: StepTimeModel, *,
             replicas: int = 1, router: str = "round-robin", horizon_s: float = 600.0,
             max_tokens: str = DEFAULT_MAX_TOKENS, slo_ttft_s: float = DEFAULT_SLO_TTFT_S,
             slo_tpot_s: float = DEFAULT_SLO_TPOT_S, max_samples: int = 20000,
             fast_forward: bool = True, front: CacheFront | None = None) -> SimResult:
    """Replay ``requests`` (their ``max_new_tokens`` is the TRUE output length) under the ``max_tokens`` cap."""
    if router not in ROUTERS:
        raise InputError(f"unknown router {router!r}; use one of {', '.join(ROUTERS)}")
    if replicas < 1:
        raise InputError(f"--replicas must be >= 1, got {replicas}")
    if not requests:
        raise InputError("the trace holds no requests")
    _check_unique_ids(requests)
    reps = [_Replica(make_scheduler()) for _ in range(replicas)]
    reqs, truth = cap_requests(sorted(requests, key=lambda r: r.arrival), str(max_tokens),
                               reps[0].sched.config.max_seq_len)
    t_start = reqs[0].arrival
    for r in reps:
        r.clock = t_start
        r.sched.clock = r.now  # queue-wait metrics in simulated seconds
    deadline = reqs[-1].arrival + horizon_s
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    rejected: dict[str, str] = {}
    samples = _Samples(max_samples)
    budget = reps[0].sched.config.token_budget  # a full chunk at context 0: the best prefill rate per token
    route = Router(router, [r.sched for r in reps], model.step_seconds([(0, budget)], 0, 0) / budget, slo_ttft_s,
                   lambda start, end: model.prefill_seconds(start, end, budget))
    steps = _replay(reqs, reps, route, model, deadline, truth,
                    (first, done, rejected), samples, fast_forward, front)
    out = Outcome(first, done, rejected, truth)
    summary = _summary(reqs, reps, out, t_start, deadline, (slo_ttft_s, slo_tpot_s), steps, str(max_tokens))
    # the plot's TTFT CDF: the first tokens the summary counts (the window's last step may end past it)
    in_window = sorted(first[r.id] - r.arrival for r in reqs if first.get(r.id, math.inf) <= deadline)
    return SimResult(summary, samples.out, in_window,
                     max(done.values(), default=math.nan) - t_start)


def _check_unique_ids(requests: Sequence[Request]) -> None:
    """Every per-request record (first token, completion, true length) is keyed by id: two requests under one id
    on two replicas overwrote each other's, and the summary lost one (3 requests, 2 completed, 0 unserved)."""
    seen: set[str] = set()
    for r in requests:
        if r.id in seen:
            raise InputError(f"request id {r.id!r} appears twice in the trace; give every request its own id")
        seen.add(r.id)


def _summary(reqs: Sequence[Request], reps: list[_Replica], out: Outcome, t_start: float, window_end: float,
             slo: tuple[float, float], steps: int, max_tokens: str) -> SimSummary:
    scheds = [r.sched for r in reps]
    hits = sum(s.cache.hits for s in scheds)
    queries = sum(s.cache.queries for s in scheds)
    busy = sum(r.busy_time for r in reps)
    stats = dict(
        preempted=sum(s.counts["preempted"] for s in scheds),
        kv_utilization_mean=sum(r.used_time for r in reps) / busy if busy else 0.0,
        prefix_hit_rate=hits / queries if queries else 0.0, steps=steps,
        num_blocks_per_replica=scheds[0].config.num_blocks, tokens_per_block=scheds[0].config.tokens_per_block,
        lora_slots=scheds[0].config.lora_slots, adapter_loads=sum(s.lora.loads for s in scheds),
        slot_hits=sum(s.slot_hits for s in scheds), slot_wait_s=sum(s.slot_wait_s for s in scheds))
    return SimSummary(policy=scheds[0].policy.name, replicas=len(reps), max_tokens=max_tokens,
                      **summarize(reqs, stats, out, t_start, window_end, slo))


def calibrate(profile: object, max_running: int = 512, token_budget: int = 8192) -> dict[str, object]:
    """Replay ``step_time.CALIBRATION`` (an offline trtllm-bench run) and return model / published throughput.

    trtllm-bench sends max_tokens = OSL and every request produces exactly OSL tokens, so the cap is ``oracle``.
    """
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
                          policy="trtllm-1.2-no-evict", token_budget=token_budget, max_running=max_running)
    res = simulate(reqs, lambda: Scheduler(cfg), model, max_tokens="oracle", horizon_s=1e9)
    # an offline benchmark's throughput is over its own run, not a serving window: tokens / last completion
    tok_s = res.summary.completed * int(c["osl"]) / res.last_completion_s
    return {"published_output_tok_s": c["output_tok_s"], "model_output_tok_s": tok_s,
            "ratio_model_over_published": tok_s / float(c["output_tok_s"]),
            "source": c["source"], "setup": f"{c['model']} {c['weights']} weights+KV on {c['gpu']}, "
            f"ISL {c['isl']} / OSL {c['osl']}, {c['num_requests']} requests at once, max batch {max_running}"}
