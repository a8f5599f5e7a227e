"""Each baseline's upstream semantics on a small hand-computed case (4-token blocks)."""

from __future__ import annotations

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.scheduler.policies import get_policy
from trtforge.scheduler.request import Request, hashes_from_tokens
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig

TPB = 4
PROMPT = list(range(32))
H = hashes_from_tokens(PROMPT, TPB)


def make(policy: str, blocks: int = 16, budget: int = 64) -> Scheduler:
    return Scheduler(SchedulerConfig(num_blocks=blocks, tokens_per_block=TPB, policy=policy, token_budget=budget,
                                     max_running=8))


@pytest.mark.parametrize("policy,admitted", [("trtllm-1.2-no-evict", False), ("trtllm-main-no-evict", True)])
def test_no_evict_prefix_credit(policy: str, admitted: bool) -> None:
    """A: prompt 32 + cap 4 = 9 blocks. B, same prompt: (32 - 1) // 4 = 7 blocks are cached. 1.2 counts all 9
    (7 free < 9: waits); main counts the 2 it adds (fits)."""
    s = make(policy)
    s.submit(Request("a", 0, 32, 4, H, TPB))
    s.step()
    assert s.used_blocks == 9
    res = s.submit(Request("b", 0, 32, 4, H, TPB))
    assert (res.status == "admitted") is admitted
    if admitted:
        assert s.used_blocks == 11 and s.seqs["b"].hits == 7


def test_no_evict_never_fit_and_head_of_line() -> None:
    """main rejects a 17-block request in a 16-block cache; 1.2 queues it forever. Both stop at the first
    request that does not fit now (no skipping): c (2 blocks) waits behind b (10 blocks) while a holds 9."""
    assert make("trtllm-1.2-no-evict").submit(Request("x", 0, 60, 8)).status == "queued"
    main = make("trtllm-main-no-evict").submit(Request("x", 0, 60, 8))
    assert main.status == "rejected" and main.reason is not None and main.reason.kind == "kv-never-fits"
    for policy in ("trtllm-1.2-no-evict", "trtllm-main-no-evict"):
        s = make(policy)
        s.submit(Request("a", 0, 32, 4))
        s.submit(Request("b", 0, 36, 4))
        s.submit(Request("c", 0, 4, 4))
        s.step()
        assert (s.state("b"), s.state("c")) == ("queued", "queued")
    ca = make("cache-aware")
    for rid, p in (("a", 32), ("b", 36), ("c", 4)):
        ca.submit(Request(rid, 0, p, 4))
    ca.step()
    assert (ca.state("b"), ca.state("c")) == ("queued", "running")  # the project's policy skips ahead


def test_vllm_v1_allocates_blocks_per_step() -> None:
    """Prompt 40 with a 16-token budget: chunks 16, 16, 8 -> 4, 8, 10 blocks after each step (max-utilization
    takes all 10 at admission). Then decode: step t writes the K/V of the token sampled at t - 1, so the KV holds
    40 + (t - 3) tokens after step t: a block is added at step 4 (41 > 40) and step 8 (45 > 44)."""
    s = make("vllm-v1", blocks=40, budget=16)
    s.submit(Request("a", 0, 40, 10))
    assert s.state("a") == "queued" and not s.seqs["a"].blocks  # vLLM admits from the waiting queue in schedule()
    held = []
    for _ in range(8):
        s.step()
        held.append(len(s.seqs["a"].blocks))
    assert held == [4, 8, 10, 11, 11, 11, 11, 12]
    m = make("max-utilization", blocks=40, budget=16)
    m.submit(Request("a", 0, 40, 10))
    assert len(m.seqs["a"].blocks) == 10


def test_vllm_v1_running_requests_get_blocks_before_waiting_ones() -> None:
    """vLLM v1 ``Scheduler.schedule``: the running queue is served first (a's decode needs its 3rd block at step 2),
    then the waiting queue with what is left. b (4 blocks) arrives when exactly 4 are free: it must wait, not be
    admitted and then preempted by a's growth in the same step (the old order: admission first)."""
    s = make("vllm-v1", blocks=6, budget=64)
    s.submit(Request("a", 0, 8, 10))  # 2 blocks, then one more at step 2
    s.step()
    s.submit(Request("b", 0, 16, 4))  # 4 blocks
    plan = s.step()
    assert plan.preempted == [] and plan.admitted == [] and s.state("b") == "queued"
    assert len(s.seqs["a"].blocks) == 3 and s.counts["preempted"] == 0


def test_vllm_v1_admits_with_the_budget_left_and_not_after_a_preemption() -> None:
    """The waiting queue gets the token budget the running requests left: one decode of a 9-token budget leaves 8,
    so b's first chunk is 8 tokens in 2 blocks (not 9 tokens in 3). A step that preempted admits nobody."""
    s = make("vllm-v1", blocks=16, budget=9)
    s.submit(Request("a", 0, 4, 20))
    s.step()  # a's prefill (4 tokens): it decodes from the next step on
    s.submit(Request("b", 0, 40, 4))
    plan = s.step()
    assert plan.decode == ["a"] and plan.admitted == ["b"] and ("b", 0, 8) in plan.context
    assert len(s.seqs["b"].blocks) == 2
    p = make("vllm-v1", blocks=5, budget=64)
    p.submit(Request("x", 0, 4, 12))  # 1 block, then grows
    p.submit(Request("y", 0, 12, 4))  # 3 blocks: both fit at first
    p.step()
    p.submit(Request("z", 0, 4, 1))  # 1 block
    for _ in range(12):
        plan = p.step()
        if plan.preempted:
            assert plan.admitted == [], plan
            break
    else:
        raise AssertionError("no preemption happened")


def test_vllm_v1_strict_fcfs_and_newest_preempted() -> None:
    """Waiting queue: b's first chunk does not fit, so c (which would) waits too. Then a and b decode in a
    full cache: the newest (b) is preempted by recompute when a needs a block."""
    s = make("vllm-v1", blocks=12, budget=64)
    s.submit(Request("a", 0, 16, 20))  # 4 blocks
    s.submit(Request("b", 0, 28, 20))  # 7 blocks
    s.submit(Request("big", 0, 8, 4))  # 2 blocks: 4 + 7 + 2 > 12
    s.submit(Request("c", 0, 4, 4))  # 1 block, but behind big
    s.step()
    assert [s.state(r) for r in ("a", "b", "big", "c")] == ["running", "running", "queued", "queued"]
    preempted: list[str] = []
    for _ in range(12):
        preempted += s.step().preempted
    assert preempted[:1] == ["b"]
    assert s.counts["preempted"] >= 1


def test_alias_keeps_old_name_and_unknown_policy_errors() -> None:
    p = get_policy("fcfs-no-evict")
    assert p.name == "fcfs-no-evict" and p == get_policy("trtllm-1.2-no-evict").__class__(
        **{**get_policy("trtllm-1.2-no-evict").__dict__, "name": "fcfs-no-evict"})
    with pytest.raises(InputError, match="vllm-v1"):
        get_policy("lifo")
