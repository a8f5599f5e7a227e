"""Issue 13's three bugs, each on a minimal hand-computed case (each of these failed before the fix)."""

from __future__ import annotations

import math

from trtforge.scheduler.prefix_cache import block_keys
from trtforge.scheduler.request import Request, hashes_from_tokens
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig

TPB = 4


def _sched(policy: str, blocks: int, **kw: object) -> Scheduler:
    return Scheduler(SchedulerConfig(num_blocks=blocks, tokens_per_block=TPB, policy=policy, token_budget=64,
                                     max_running=8, **kw))  # type: ignore[arg-type]


def test_adapter_with_zero_lora_slots_is_rejected_at_submit() -> None:
    for policy in ("fcfs-no-evict", "max-utilization", "cache-aware"):
        s = _sched(policy, 16, lora_slots=0, adapters=("a",))
        res = s.submit(Request("x", 0, 4, 4, adapter="a"))
        assert res.status == "rejected" and res.reason is not None
        assert res.reason.kind == "no-lora-slot" and "0 slots" in res.reason.message
        assert s.submit(Request("base", 0, 4, 4)).status == "admitted"  # nothing is blocked behind it
        for _ in range(10):
            s.step()
        assert s.state("base") == "finished" and not s.queue


def test_block_keys_include_adapter_and_salt() -> None:
    tokens = list(range(32))
    h = hashes_from_tokens(tokens, TPB)

    def keys(adapter: str | None = None, salt: str | None = None) -> tuple[int, ...]:
        return block_keys(Request("r", 0, 32, 1, h, TPB, adapter=adapter, cache_salt=salt), TPB)

    base, a, b = keys(), keys("a"), keys("b")
    assert len(base) == len(a) == len(b) == 8
    assert not set(base) & set(a) and not set(a) & set(b)  # nothing shared across adapters or with the base model
    assert keys("a") == a and keys(salt="s") == keys(salt="s") and not set(keys(salt="s")) & set(base)
    assert not set(keys("a", "s")) & set(a)


def test_prefix_shared_only_under_the_same_adapter() -> None:
    h = hashes_from_tokens(list(range(40)), TPB)
    s = _sched("cache-aware", 40, lora_slots=2, adapters=("a", "b"))
    s.submit(Request("a1", 0, 40, 4, h, TPB, adapter="a"))
    for _ in range(2):
        s.step()
    s.submit(Request("b1", 0, 40, 4, h, TPB, adapter="b"))
    s.submit(Request("base", 0, 40, 4, h, TPB))
    s.submit(Request("a2", 0, 40, 4, h, TPB, adapter="a"))
    assert s.seqs["b1"].hits == 0 and s.seqs["base"].hits == 0
    assert s.seqs["a2"].hits == 9  # (40 - 1) // 4 full blocks before the last prompt token, as without adapters
    assert s.seqs["a2"].blocks[:9] == s.seqs["a1"].blocks[:9]


def test_max_utilization_growth_after_recompute_counts_generated_tokens_once() -> None:
    """r0 and r1 (prompt 4, cap 30: 34 tokens = 9 blocks each) share 12 blocks. Both decode and grow one block
    per 4 tokens until the pool runs dry; r1 (newest) is preempted, then recomputed with prompt 4 + G.
    After every step each decoding request must hold exactly ceil((prompt + generated before this step) / 4)
    blocks: the bug counted G twice after the recompute (prompt_len already includes G)."""
    s = _sched("max-utilization", 12)
    s.submit(Request("r0", 0, 4, 30))
    s.submit(Request("r1", 0, 4, 30))
    worst_over = 0
    preempted: list[str] = []
    for _ in range(200):
        plan = s.step()
        preempted += plan.preempted
        t = plan.step
        for seq in s.decoding.values():
            need = math.ceil((seq.req.prompt_tokens + seq.generated(t - 1)) / TPB)
            worst_over = max(worst_over, len(seq.blocks) - need)
        if not s.running and not s.queue:
            break
    assert preempted == ["r1"]
    assert worst_over == 0
    assert s.state("r0") == s.state("r1") == "finished" and s.used_blocks == 0
