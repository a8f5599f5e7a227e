"""Held-out QA (session 26): preemption and liveness. A preempted request's computed blocks stay findable for its
own recompute (vllm-v1 re-admitted a hashless request whose next chunk did not fit, every other step, to preempt it
again); and adversarial streams (one long shared prefix then diverging, requests exactly filling the pool, one
needing every block, fewer LoRA slots than adapters in use, pools of 1-3 blocks) end in bounded steps with every
request finished or rejected under the limit it exceeds, the block invariants checked after every step."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.simulator import cap_requests, simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_replay_invariants import MODEL, CheckedScheduler, check_invariants  # noqa: E402

POLICIES = ["trtllm-main-no-evict", "max-utilization", "vllm-v1", "cache-aware"]


def _drain(s: Scheduler) -> int:
    steps = 0
    while s.running or s.queue:
        s.step()
        check_invariants(s)
        steps += 1
    return steps


def test_vllm_v1_does_not_readmit_a_request_only_to_preempt_it_again() -> None:
    # b's first 256-token chunk fits beside a, its second does not: b preempts itself. It came back the next step
    # (nothing of its computed chunk was findable: no trace hashes), ran its first chunk again and was preempted
    # again: 121 preemptions while a decoded. Now its recompute counts its own cached chunk: it waits for room.
    s = Scheduler(SchedulerConfig(num_blocks=32, tokens_per_block=16, policy="vllm-v1", token_budget=256,
                                  max_running=4))
    s.submit(Request("a", 0.0, 16, 400))
    s.step()
    s.submit(Request("b", 0.0, 500, 4))
    assert _drain(s) == 404
    assert s.counts["preempted"] == 1 and s.state("a") == s.state("b") == "finished"
    assert s.seqs["b"].hits > 0  # re-admitted onto what eviction left of its own blocks


@pytest.mark.parametrize("policy", ["max-utilization", "vllm-v1"])
def test_preempted_decoder_resumes_on_its_own_blocks(policy: str) -> None:
    s = Scheduler(SchedulerConfig(num_blocks=12, tokens_per_block=4, policy=policy, token_budget=64, max_running=4))
    s.submit(Request("a", 0.0, 8, 30))
    s.submit(Request("b", 0.0, 8, 30))
    events = []
    while s.running or s.queue:
        plan = s.step()
        check_invariants(s)
        if plan.preempted or "b" in plan.admitted:
            events.append((plan.step, plan.preempted, s.seqs["b"].hits))
    # b (the newest) is preempted at step 18 holding 24 tokens of K/V in 6 blocks; a's growth reclaims 4 of them
    # (tail first), b resumes at step 31 on the other 2 (it recomputed all 6 before)
    # (vLLM v1 admits both from its waiting queue in step 1; max-utilization admitted them at submission)
    first = [(1, [], 0)] if policy == "vllm-v1" else []
    assert events == [*first, (18, ["b"], 0), (31, [], 2)]
    assert s.counts["finished"] == 2 and s.used_blocks == 0


def _stream(kind: str, rng: random.Random, tpb: int, blocks: int, n: int = 30) -> list[Request]:
    out = []
    for i in range(n):
        t, adapter, hashes = (rng.uniform(0, 3) if rng.random() < 0.5 else 0.0), None, ()
        tot = tpb * blocks
        if kind == "shared-prefix":  # one long prefix, then diverging
            p, o = rng.randint(max(1, tot // 2), tot // 2 + 3 * tpb), rng.randint(1, 2 * tpb)
            hashes = (*tuple(range(1, p // tpb))[:-1], 1000 + i)
        elif kind == "exact-fill":  # prompt + output = the whole pool
            p = rng.randint(1, tot - 1)
            o, hashes = tot - p, tuple(range(1, p // tpb + 1))
        elif kind == "every-block":  # every 4th needs every block, the others are small
            p, o = (tot - 1, 1) if i % 4 == 0 else (rng.randint(1, 3 * tpb), rng.randint(1, 2 * tpb))
        else:  # lora: 5 adapters in use over 2 slots
            p, o = rng.randint(1, 4 * tpb), rng.randint(1, 4 * tpb)
            adapter, hashes = rng.choice([None, "a", "b", "c", "d", "e"]), tuple([7, 8, 9][:p // tpb])
        out.append(Request(f"{kind}-{i}", t, p, o, block_hashes=hashes, hash_block_tokens=tpb, adapter=adapter))
    return out


@pytest.mark.parametrize("kind", ["shared-prefix", "exact-fill", "every-block", "lora"])
def test_adversarial_streams_end_and_reject_only_what_exceeds_a_limit(kind: str) -> None:
    rng = random.Random(["shared-prefix", "exact-fill", "every-block", "lora"].index(kind))
    for policy in POLICIES:
        for blocks, tpb in [(1, 4), (2, 4), (3, 16), (8, 4), (16, 16)]:
            for max_tokens in ("oracle", "7"):
                reqs = _stream(kind, rng, tpb, blocks)
                cfg = SchedulerConfig(num_blocks=blocks, tokens_per_block=tpb, policy=policy,
                                      max_seq_len=tpb * blocks * 4, token_budget=64, max_running=8, lora_slots=2,
                                      adapters=("a", "b", "c", "d", "e"))
                sm = simulate(reqs, lambda cfg=cfg: CheckedScheduler(cfg), MODEL, max_tokens=max_tokens,
                              horizon_s=1e5).summary
                assert sm.completed + sm.rejected == len(reqs) and sm.unserved == 0, (policy, blocks, sm)
                capped, _ = cap_requests(reqs, max_tokens, cfg.max_seq_len)
                long = sum(r.total_tokens > cfg.max_seq_len for r in capped)  # checked first
                never = sum(r.total_tokens <= cfg.max_seq_len and math.ceil(r.total_tokens / tpb) > blocks
                            for r in capped)
                want = {k: v for k, v in (("prompt-too-long", long), ("kv-never-fits", never)) if v}
                assert sm.rejected_by_kind == want, (policy, blocks)


def test_slot_wait_counts_only_the_time_kv_was_there() -> None:
    # r2 waits for the one LoRA slot (r1's) with KV free; at step 3 r3 (base model) skips ahead and takes the KV,
    # so from then on r2 waits for KV too, until r3 ends at step 27: slot_wait_s counted all 26 s (its doc: seconds
    # requests waited with KV available but no LoRA slot), now the 3 s before r3 took the KV
    now = [0.0]
    s = Scheduler(SchedulerConfig(num_blocks=20, tokens_per_block=4, policy="cache-aware", token_budget=64,
                                  max_running=8, lora_slots=1, adapters=("a", "b")), clock=lambda: now[0])
    admitted: dict[str, float] = {}

    def run(steps: int) -> None:
        for _ in range(steps):
            now[0] += 1.0
            admitted.update((rid, now[0]) for rid in s.step().admitted)

    s.submit(Request("r1", 0, 4, 10, adapter="a"))  # 4 blocks, admitted at once
    run(1)
    s.submit(Request("r2", 0, 4, 16, adapter="b"))  # 5 blocks: they fit, the slot does not
    run(1)
    s.submit(Request("r3", 0, 40, 24))  # 16 blocks: all that is left
    run(40)
    assert admitted == {"r3": 3.0, "r2": 27.0} and s.slot_wait_s == 3.0
