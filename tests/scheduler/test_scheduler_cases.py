"""Concrete scheduler scenarios: never-fit rejection, head-of-line blocking, preemption, aging, LoRA slots."""

from __future__ import annotations

import random

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.scheduler.block_pool import BlockPool, BlockPoolError
from trtforge.scheduler.lora_slots import LoraSlots
from trtforge.scheduler.prefix_cache import PrefixCache
from trtforge.scheduler.request import Request, hashes_from_tokens
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig


def run_until_idle(s: Scheduler, limit: int = 10000) -> int:
    for i in range(limit):
        if not s.running and not s.queue:
            return i
        s.step()
    return limit


def make(policy: str, blocks: int = 16, **kw) -> Scheduler:
    kw.setdefault("token_budget", 64)
    kw.setdefault("max_running", 8)
    return Scheduler(SchedulerConfig(num_blocks=blocks, tokens_per_block=4, policy=policy, **kw), metrics=True)


def test_never_fit_rejected_at_once_and_others_run() -> None:
    s = make("cache-aware")
    big = s.submit(Request("big", 0, 60, 10))  # 70 tokens = 18 blocks > 16
    assert big.status == "rejected" and big.reason is not None
    r = big.reason
    assert (r.kind, r.blocks_needed, r.capacity_blocks) == ("kv-never-fits", 18, 16)
    assert "18 KV blocks" in r.message and "16 blocks" in r.message and "lower max_new_tokens" in r.message
    for i in range(5):
        assert s.submit(Request(f"s{i}", 0, 7, 5)).status in ("admitted", "queued")
    run_until_idle(s)
    assert all(s.state(f"s{i}") == "finished" for i in range(5))
    assert s.metrics.sample("trtforge_scheduler_rejected_total") == 1


def test_fcfs_no_evict_never_fit_blocks_the_queue_forever() -> None:
    s = make("fcfs-no-evict")
    assert s.submit(Request("big", 0, 60, 10)).status == "queued"  # TensorRT-LLM <= 1.2: never rejected
    for i in range(3):
        s.submit(Request(f"s{i}", 0, 7, 5))
    assert run_until_idle(s, 500) == 500
    assert [s.state(x) for x in ("big", "s0", "s1", "s2")] == ["queued"] * 4


def test_fcfs_head_of_line_vs_cache_aware_skip_ahead() -> None:
    states = {}
    for policy in ("fcfs-no-evict", "cache-aware"):
        s = make(policy)
        s.submit(Request("long", 0, 30, 10))  # 10 blocks, runs for a while
        s.step()
        s.submit(Request("wide", 0, 20, 10))  # 8 blocks: does not fit next to "long" (6 left)
        s.submit(Request("small", 0, 7, 5))  # 3 blocks: fits
        s.step()
        states[policy] = (s.state("wide"), s.state("small"))
        run_until_idle(s)
        assert s.state("wide") == s.state("small") == "finished"
    assert states["fcfs-no-evict"] == ("queued", "queued")  # head-of-line blocking
    assert states["cache-aware"] == ("queued", "running")  # skipped ahead


def test_max_utilization_preempts_newest_and_recovers() -> None:
    s = make("max-utilization", blocks=12)
    for i in range(3):
        s.submit(Request(f"r{i}", 0, 8, 24))  # prompt needs 2 blocks, completion 8: 3 x 8 > 12
    preempted: list[str] = []
    for _ in range(400):
        preempted += s.step().preempted
        if not s.running and not s.queue:
            break
    assert preempted and preempted[0] == "r2"  # the newest first
    assert all(s.state(f"r{i}") == "finished" for i in range(3))
    assert s.counts["preempted"] == len(preempted)
    assert s.metrics.sample("trtforge_scheduler_preempted_total") == len(preempted)
    for policy in ("cache-aware", "fcfs-no-evict"):
        t = make(policy, blocks=12)
        for i in range(3):
            t.submit(Request(f"r{i}", 0, 8, 24))
        run_until_idle(t)
        assert t.counts["preempted"] == 0 and t.counts["finished"] == 3


@pytest.mark.parametrize("max_skips,starves", [(3, False), (10**9, True)])
def test_aging_prevents_starvation(max_skips: int, starves: bool) -> None:
    """A wide request among a steady stream of small ones is admitted once it has been passed over max_skips
    times; with unbounded skipping (no aging) it keeps being overtaken."""
    s = make("cache-aware", blocks=16, skip_window=4, max_skips=max_skips)
    s.submit(Request("small-first", 0, 7, 9))  # 4 blocks
    s.step()
    assert s.submit(Request("wide", 0, 48, 8)).status == "queued"  # 14 blocks: needs the pool nearly empty
    admitted_at = None
    for t in range(300):
        s.submit(Request(f"s{t}", 0, 7, 3))  # a steady stream of 3-block requests that keeps the pool busy
        s.step()
        if s.state("wide") != "queued":
            admitted_at = t
            break
    assert (admitted_at is None) == starves


def test_shared_prefix_counted_once_and_hit() -> None:
    tokens = [random.Random(0).randrange(1000) for _ in range(40)]
    s = make("cache-aware", blocks=20)
    keys = hashes_from_tokens(tokens, 4)
    s.submit(Request("a", 0, 40, 4, block_hashes=keys, hash_block_tokens=4))
    for _ in range(3):
        s.step()
    used_one = s.used_blocks
    assert used_one == 11  # 44 tokens
    # same prompt: the first 9 full blocks are shared (the block with the last prompt token is recomputed)
    assert s.submit(Request("b", 0, 40, 4, block_hashes=keys, hash_block_tokens=4)).status == "admitted"
    assert s.used_blocks == used_one + 2
    seq_a, seq_b = s.seqs["a"], s.seqs["b"]
    assert seq_a.blocks[:9] == seq_b.blocks[:9] and seq_b.hits == 9
    assert all(s.pool.ref_count[b] == 2 for b in seq_b.blocks[:9])
    run_until_idle(s)
    assert s.cache.hit_rate() == pytest.approx(9 / 18)
    assert s.metrics.sample("trtforge_scheduler_prefix_hit_rate") == pytest.approx(0.5)


def test_block_pool_never_double_frees() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    assert pool.unref(blocks[0]) == 0
    pool.release(blocks[0])
    with pytest.raises(BlockPoolError, match="twice"):
        pool.unref(blocks[0])
    with pytest.raises(BlockPoolError):
        pool.allocate(4)
    cache = PrefixCache(pool)
    cache.register(blocks[1], 123)
    cache.free([blocks[1]])
    assert cache.num_cached_free == 1 and cache.available == 4
    got = cache.allocate(4)  # reclaims the cached-free block, LRU
    assert sorted(got) == [0, 1, 2, 3] and cache.num_cached == 0


def test_lora_slots_pin_and_reclaim_lru() -> None:
    slots = LoraSlots(2, ["a", "b", "c"])
    sa = slots.acquire("a")
    sb = slots.acquire("b")
    assert not slots.can_acquire("c")  # both pinned
    slots.release("a")
    assert slots.can_acquire("c")
    assert slots.acquire("c") == sa  # reclaimed a's slot, not b's (pinned)
    assert slots.slot_of == {"b": sb, "c": sa}
    with pytest.raises(InputError, match="unknown LoRA adapter"):
        slots.acquire("zz")
    slots.release("b")
    slots.release("c")
    with pytest.raises(BlockPoolError):
        slots.release("c")


def test_scheduler_waits_for_lora_slot_and_rejects_unknown() -> None:
    s = make("cache-aware", lora_slots=1, adapters=("x", "y"))
    assert s.submit(Request("ux", 0, 4, 20, adapter="x")).status == "admitted"
    assert s.submit(Request("uy", 0, 4, 2, adapter="y")).status == "queued"  # the only slot is pinned by x
    res = s.submit(Request("uz", 0, 4, 2, adapter="z"))
    assert res.status == "rejected" and res.reason.kind == "unknown-adapter" and "'z'" in res.reason.message
    s.step()
    assert s.state("uy") == "queued"
    run_until_idle(s)
    assert s.state("uy") == "finished" and s.lora.slot_of == {"y": 0}


def test_prompt_too_long_and_api_errors() -> None:
    s = make("cache-aware", max_seq_len=32)
    res = s.submit(Request("p", 0, 30, 8))
    assert res.reason is not None and res.reason.kind == "prompt-too-long" and "32" in res.reason.message
    with pytest.raises(InputError, match="twice"):
        s.submit(Request("p", 0, 3, 3))
    with pytest.raises(InputError, match="unknown request"):
        s.finish("nope")
    s.submit(Request("q", 0, 3, 3))
    s.cancel("q")
    with pytest.raises(InputError, match="already cancelled"):
        s.cancel("q")
