"""Held-out QA (session 26), routers: a response-cache hit in front of the scheduler is routed (round-robin's turn
counts it) but is no load: the cache-aware router's signals (arrived prompt tokens, each replica's drained tokens)
leave it out; prefix-affinity counts only the cached blocks admission can reuse."""

from __future__ import annotations

from functools import partial

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.cache_costs import TierCosts
from trtforge.scheduler.sim.response_cache import CacheFront
from trtforge.scheduler.sim.router import Router
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel

COSTS = TierCosts(hit={"l1": 5e-5, "l2": 3e-4}, miss=1e-3)
MODEL = StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])
CFG = SchedulerConfig(num_blocks=40000, tokens_per_block=64, max_running=64, max_seq_len=131072)


def test_a_cache_hit_leaves_the_routers_load_signals() -> None:
    a, b = Scheduler(CFG), Scheduler(CFG)
    router = Router("cache-aware", [a, b], 1e-5)
    big = Request("hit", 0.0, 60000, 4)
    k = router.pick(big, 0)
    router.answered_by_cache(big, k)  # it never reaches replica k's scheduler
    assert router.load.arrived == 0 and router.load.last_sent == [0, 0]
    b.submit(Request("miss", 1.0, 5000, 4))
    router.load.record(1, 5000)
    router.pick(Request("next", 2.0, 100, 4), 2)  # b drained what it was sent, not a hit's 60,000 tokens
    assert router.load.drained[1] <= 5000 and router.load.arrived == 5100


def test_misses_spread_when_hits_take_every_other_round_robin_turn() -> None:
    # every other arrival is a repeat of a 60k-token prompt answered by the cache: round-robin's turns put every
    # miss (50k tokens, 1.2 s apart) on replica 1. Counting the hits' tokens as arrivals made the router see an
    # overload (arrivals >= 2 x the best prefill rate) and stay round-robin: 33 of 40 misses on replica 1, TTFT p99
    # 32 s; without them it moves misses that replica 1 would certainly serve late to the idle replica 0
    hot = tuple(range(1, 117))
    reqs = [Request("hot", 0.0, 60000, 4, block_hashes=hot), Request("pad", 0.5, 100, 4, block_hashes=(999,))]
    for i in range(40):
        reqs.append(Request(f"h{i}", 30.0 + 1.2 * i, 60000, 4, block_hashes=hot))
        reqs.append(Request(f"m{i}", 30.01 + 1.2 * i, 50000, 20,
                            block_hashes=tuple(10**6 + 1000 * i + k for k in range(97))))
    made: list[Scheduler] = []
    front = CacheFront(("l1", "l2"), COSTS, ttl_s=1e6)
    sm = simulate(reqs, lambda: made.append(Scheduler(CFG)) or made[-1], MODEL, replicas=2, router="cache-aware",
                  front=front, horizon_s=300).summary
    assert sum(front.hits.values()) == 40 and sm.completed == len(reqs)
    misses = [sum(rid.startswith("m") for rid in s.seqs) for s in made]
    assert min(misses) >= 15, misses
    assert sm.ttft_p99_s < 10.0
    rr = simulate(reqs, partial(Scheduler, CFG), MODEL, replicas=2, router="round-robin",
                  front=CacheFront(("l1", "l2"), COSTS, ttl_s=1e6), horizon_s=300).summary
    assert rr.ttft_p99_s > 20.0  # round-robin itself does put them all on one replica


def test_prefix_affinity_counts_only_blocks_admission_reuses() -> None:
    # a 128-token prompt of two 64-token blocks: admission never reuses the block holding the last prompt token,
    # so replica 0 (both blocks cached, 3 requests busy) and replica 1 (the first block cached, idle) give it the
    # same 1-block hit; prefix-affinity counted 2 against 1 and sent it to the busier replica
    a, b = Scheduler(CFG), Scheduler(CFG)
    for s, hashes in ((a, (1, 2)), (b, (1, 9))):
        s.submit(Request("warm", 0, 128, 4, hashes, 64))
        s.step()
        s.finish("warm")
    for k in range(3):
        a.submit(Request(f"busy{k}", 0, 100, 50))
    probe = Request("probe", 0, 128, 4, (1, 2), 64)
    assert Router("prefix-affinity", [a, b]).pick(probe, 0) == 1
    assert [s.submit(probe).status for s in (a, b)] == ["admitted", "admitted"]
    assert a.seqs["probe"].hits == b.seqs["probe"].hits == 1
