"""Issue 13, round 3: the cache-aware router leaves round-robin only from a certain TTFT miss to a likely hit,
and follows a cached prefix only between replicas that both start the request at once."""

from __future__ import annotations

import random
from functools import partial

import pytest

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.router import Router
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel

HOT = tuple(range(8))  # 8 x 512 = 4,096 prompt tokens


def _model() -> StepTimeModel:
    return StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])


def _per_token(cfg: SchedulerConfig) -> float:
    return _model().step_seconds([(0, cfg.token_budget)], 0, 0) / cfg.token_budget


def test_cache_aware_router_decisions() -> None:
    cfg = SchedulerConfig(num_blocks=4000, tokens_per_block=64, max_running=4)
    a, b = Scheduler(cfg), Scheduler(cfg)
    a.submit(Request("warm", 0, 4096, 4, HOT))
    a.step()
    a.finish("warm")  # its prompt blocks stay cached (cached-free) on replica 0
    rate = _per_token(cfg)
    router = Router("cache-aware", [a, b], rate, slo_ttft_s=5.0)
    probe = Request("probe", 0, 4096, 4, HOT)
    assert router.pick(probe, 1) == 0  # both start it now, equally free after it: the cached prefix wins
    cold = Request("cold", 0, 4096, 4, tuple(range(100, 108)))
    assert [router.pick(cold, i) for i in (1, 2)] == [1, 0]  # nothing cached: round-robin
    # replica 1 queues 40 x 8,000 prompt tokens: > 5 s of prefill at the best rate, a certain miss there;
    # replica 0 starts the request at once: it goes there, cached or not
    for k in range(40):
        b.submit(Request(f"q{k}", 0, 8000, 4))
    assert 40 * 8000 * rate > 5.0
    assert router.pick(cold, 1) == 0 and router.pick(probe, 1) == 0
    # replica 0 also queues (it cannot start anything at once): nobody meets the SLO for sure -> round-robin
    for k in range(40):
        a.submit(Request(f"p{k}", 0, 8000, 4))
    assert [router.pick(probe, i) for i in (1, 2)] == [1, 0]
    # a short queue on RR's replica is no certain miss: no move, however idle the other replica is
    c, d = Scheduler(cfg), Scheduler(cfg)
    for k in range(6):
        d.submit(Request(f"s{k}", 0, 1000, 4))
    assert d.queue and Router("cache-aware", [c, d], rate).pick(cold, 1) == 1
    assert Router("round-robin", [a, b]).pick(probe, 1) == 1


def _skewed(seed: int, n: int, gap: float) -> list[Request]:
    """Even arrivals: long prompts (a hot 4k-token prefix + a fresh 4k-12k tail); odd ones: short fresh prompts.
    Round-robin over 2 replicas puts every long one on replica 0 (overloaded) and every short one on replica 1."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2 == 0:
            hashes = HOT + tuple(range(10**6 + 100 * i, 10**6 + 100 * i + rng.randint(8, 24)))
        else:
            hashes = tuple(range(10**6 + 100 * i, 10**6 + 100 * i + rng.randint(1, 3)))
        out.append(Request(f"s{i}", (i + rng.uniform(-0.4, 0.4)) * gap, 512 * len(hashes), rng.randint(16, 300),
                           hashes))
    return sorted(out, key=lambda r: r.arrival)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cache_aware_router_beats_round_robin_on_a_hot_overloaded_replica(seed: int) -> None:
    reqs = _skewed(seed, 200, 0.1)
    cfg = SchedulerConfig(num_blocks=2000, tokens_per_block=64, policy="cache-aware", max_running=32,
                          max_seq_len=32768)
    runs = {r: simulate(reqs, partial(Scheduler, cfg), _model(), replicas=2, router=r, horizon_s=120).summary
            for r in ("cache-aware", "round-robin")}
    ca, rr = runs["cache-aware"], runs["round-robin"]
    assert rr.goodput_req_s < 0.9 * len(reqs) / reqs[-1].arrival  # round-robin misses SLOs: overloaded
    assert ca.goodput_req_s >= rr.goodput_req_s
