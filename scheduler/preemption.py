"""Growth and preemption by recompute (``max-utilization`` and ``vllm-v1``), a mixin of ``Scheduler``.

Safety conditions: a block is taken only from the pool's free count (``PrefixCache.available``, less the blocks the
executor holds outside this accounting for ``_cover``), so nothing is over-committed; a preempted request frees
every block it holds (its computed blocks stay findable by it alone, ``keep_own_blocks``) and goes back to the head
of the waiting queue with its prompt grown by what it generated, so its recompute yields the same tokens.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable

from .metrics import SchedulerMetrics
from .plan import SchedulerConfig, StepPlan
from .prefix_cache import PrefixCache, keep_own_blocks
from .request import Seq


class Preemption:
    config: SchedulerConfig
    cache: PrefixCache
    clock: Callable[[], float]
    metrics: SchedulerMetrics | None
    step_no: int
    seqs: dict[str, Seq]
    queue: OrderedDict[str, Seq]
    running: OrderedDict[str, Seq]
    counts: dict[str, int]
    outside_blocks: int
    queued_tokens: int
    _grow_heap: list[tuple[int, int, str]]

    def _release(self, seq: Seq) -> None:
        raise NotImplementedError  # Scheduler's

    def _push_grow(self, seq: Seq) -> None:
        # KV tokens after step s: prompt + generated(s - 1) (a decode writes the previous token's K/V), the ORIGINAL
        # prompt (prompt_len holds gen_base again after a recompute); a block is due at the first s past the blocks
        s = len(seq.blocks) * self.config.tokens_per_block - seq.req.prompt_tokens - seq.gen_base + seq.dec_base + 2
        if s <= seq.dec_base + seq.req.max_new_tokens - seq.gen_base:
            heapq.heappush(self._grow_heap, (s, seq.epoch, seq.req.id))

    def _grow(self, plan: StepPlan, t: int) -> None:
        heap = self._grow_heap
        while heap and heap[0][0] <= t:
            _, epoch, rid = heapq.heappop(heap)
            seq = self.seqs[rid]
            if seq.epoch != epoch or not seq.decoding:
                continue
            while self.cache.available < 1 and seq.state == "running":
                self._preempt(self._newest_running(), plan, t)
            if seq.state != "running":
                continue
            seq.blocks.append(self.cache.allocate_one())
            self._push_grow(seq)

    def _cover(self, seq: Seq, tokens: int, plan: StepPlan, t: int) -> bool:
        """vLLM v1 (``KVCacheManager.allocate_slots``): give ``seq`` the blocks for ``tokens`` tokens now,
        preempting the newest running request while they do not fit; False if ``seq`` itself had to go."""
        need = -(-tokens // self.config.tokens_per_block) - len(seq.blocks)
        while need > self.cache.available - self.outside_blocks and seq.state == "running":
            self._preempt(self._newest_running(), plan, t)
        if seq.state != "running":
            return False
        if need > 0:
            seq.blocks += self.cache.allocate(need)
        return True

    def _newest_running(self) -> Seq:
        return next(reversed(self.running.values()))

    def _preempt(self, seq: Seq, plan: StepPlan, t: int) -> None:
        generated = seq.generated(t - 1)  # the K/V of all but the last one sampled is written
        keep_own_blocks(self.cache, seq, self.config.tokens_per_block,
                        seq.req.prompt_tokens + generated - 1 if seq.decoding else seq.computed)
        self._release(seq)
        seq.state = "queued"
        seq.prompt_len = seq.req.prompt_tokens + generated
        seq.gen_base = generated
        seq.computed = 0
        seq.queued_step = self.step_no
        seq.queued_at = self.clock()
        self.queue[seq.req.id] = seq
        self.queue.move_to_end(seq.req.id, last=False)
        self.queued_tokens += seq.prompt_len
        self.counts["preempted"] += 1
        plan.preempted.append(seq.req.id)
        if self.metrics:
            self.metrics.preempted.inc()
