"""Stateful property tests: random submit / step / finish / cancel sequences against every policy."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig

TPB = 4
BLOCKS = 24
PREFIXES = [(), (1, 2, 3), (1, 2, 4), (7, 8)]  # hash ids of 8-token blocks: groups share leading blocks


class SchedulerMachine(RuleBasedStateMachine):
    policy = "cache-aware"

    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.rejected: dict[str, object] = {}

    @initialize(slots=st.integers(1, 3))
    def setup(self, slots: int) -> None:
        self.s = Scheduler(SchedulerConfig(num_blocks=BLOCKS, tokens_per_block=TPB, policy=self.policy,
                                           token_budget=20, max_running=6, max_seq_len=200, lora_slots=slots,
                                           adapters=("a", "b", "c", "d"), skip_window=3, max_skips=4),
                           metrics=self.n % 2 == 0)

    @rule(prompt=st.integers(1, 60), new=st.integers(1, 40), prefix=st.sampled_from(PREFIXES),
          adapter=st.sampled_from([None, None, "a", "b", "c", "d", "zz"]))
    def submit(self, prompt: int, new: int, prefix: tuple[int, ...], adapter: str | None) -> None:
        rid = f"r{self.n}"
        self.n += 1
        res = self.s.submit(Request(rid, 0.0, prompt, new, block_hashes=prefix, hash_block_tokens=8,
                                    adapter=adapter))
        need = math.ceil((prompt + new) / TPB)
        if res.status == "rejected":
            r = res.reason
            assert r is not None and r.message
            if adapter == "zz":
                assert r.kind == "unknown-adapter"
            elif prompt + new > 200:
                assert r.kind == "prompt-too-long"
            else:
                assert r.kind == "kv-never-fits" and r.blocks_needed == need > BLOCKS == r.capacity_blocks
                assert str(need) in r.message and str(BLOCKS) in r.message
            self.rejected[rid] = r
        else:
            assert adapter != "zz"
            if self.policy != "fcfs-no-evict":
                assert need <= BLOCKS

    @rule()
    def step(self) -> None:
        plan = self.s.step()
        assert plan.num_tokens <= self.s.config.token_budget
        if not self.s.policy.preempts:
            assert not plan.preempted

    @precondition(lambda self: bool(self.s.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.s.running)))
        self.s.finish(rid)
        assert self.s.state(rid) == "finished"

    @precondition(lambda self: bool(self.s.running) or bool(self.s.queue))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted([*self.s.running, *self.s.queue])))
        self.s.cancel(rid)
        assert self.s.state(rid) == "cancelled"

    @invariant()
    def blocks_accounted(self) -> None:
        s = getattr(self, "s", None)
        if s is None:
            return
        holders: dict[int, int] = {}
        for seq in s.running.values():
            assert len(set(seq.blocks)) == len(seq.blocks)
            for b in seq.blocks:
                holders[b] = holders.get(b, 0) + 1
            if s.policy.reserve_to_completion:  # everything it can ever need is already allocated
                assert len(seq.blocks) >= math.ceil((seq.prompt_len + seq.req.max_new_tokens) / TPB)
        pool = s.pool
        for b in range(BLOCKS):
            assert pool.ref_count[b] == holders.get(b, 0)  # shared prefix blocks: one block, n references
            if b in holders:
                assert not pool.is_free(b)
        # used (distinct blocks held) + free + cached-free == all: never over-committed, nothing leaked
        assert len(holders) + pool.num_free + s.cache.num_cached_free == BLOCKS
        assert s.used_blocks == len(holders)
        assert set(s.lora.pinned()) == {q.req.adapter for q in s.running.values() if q.req.adapter}
        assert len(s.lora.slot_of) <= s.lora.num_slots
        for seq in s.seqs.values():
            assert seq.state in ("queued", "running", "finished", "cancelled", "rejected")
            assert (seq.state == "rejected") == (seq.req.id in self.rejected)

    def teardown(self) -> None:
        s = getattr(self, "s", None)
        if s is None:
            return
        # no more arrivals: every admissible request must run to completion (no starvation, no leak)
        for _ in range(2000):
            if not s.running and not s.queue:
                break
            s.step()
        stuck = [q for q in s.queue.values()]
        if self.policy == "fcfs-no-evict":
            # only a never-fit request at the head can block, and everything left is behind it
            if stuck:
                assert math.ceil(stuck[0].req.total_tokens / TPB) > BLOCKS
        else:
            assert not stuck and not s.running
        if not s.running:
            assert s.used_blocks == 0
            assert s.pool.num_free + s.cache.num_cached_free == BLOCKS
            assert not s.lora.pinned()


SETTINGS = settings(max_examples=100, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class CacheAwareMachine(SchedulerMachine):
    policy = "cache-aware"


class FcfsMachine(SchedulerMachine):
    policy = "fcfs-no-evict"


class MaxUtilMachine(SchedulerMachine):
    policy = "max-utilization"


class VllmV1Machine(SchedulerMachine):
    policy = "vllm-v1"


TestCacheAware = CacheAwareMachine.TestCase
TestCacheAware.settings = SETTINGS
TestFcfs = FcfsMachine.TestCase
TestFcfs.settings = SETTINGS
TestMaxUtil = MaxUtilMachine.TestCase
TestMaxUtil.settings = SETTINGS
TestVllmV1 = VllmV1Machine.TestCase
TestVllmV1.settings = SETTINGS
