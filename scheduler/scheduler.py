"""The KV-aware request scheduler: admission by KV blocks, then the step's token budget (vLLM v1's split).

``submit`` rejects what can never run (structured ``RejectReason``). ``schedule`` admits per the policy (the
capacity stage, ``admit``, is public: the TensorRT-LLM adapter calls it alone) and returns this step's work
(context chunks with chunked prefill, one decode token per decoding request); ``update(plan)`` applies it once the
executor ran it; ``step`` is both. ``finish`` (end-of-sequence, which only the executor or the simulator knows)
and ``cancel`` free a request's blocks and adapter slot. A request that reaches its cap (``max_new_tokens``) is
finished by ``update`` itself (listed in ``StepPlan.finished``).

Invariants (checked by the stateful tests): a block is owned only through the block pool's reference counts, so
blocks are never over-committed or freed twice; a reserve-to-completion policy allocates every block a request
can need at admission, so an admitted request always completes; all blocks return when all requests end.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from trtforge.build_engine.core.errors import InputError

from .block_pool import BlockPool
from .lora_slots import LoraSlots
from .metrics import SchedulerMetrics
from .plan import RejectKind, RejectReason, SchedulerConfig, StepPlan, SubmitResult, admit_lower_bound, reject_reason
from .policies import Policy, get_policy
from .preemption import Preemption
from .prefix_cache import PrefixCache, num_block_keys, seq_keys
from .request import Request, Seq

__all__ = ["RejectKind", "RejectReason", "Scheduler", "SchedulerConfig", "StepPlan", "SubmitResult"]

class Scheduler(Preemption):
    def __init__(self, config: SchedulerConfig, metrics: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock`` times queue waits for the metrics (the simulator passes its simulated clock)."""
        self.config = config
        self.clock = clock
        self.policy: Policy = get_policy(config.policy, config.skip_window, config.max_skips)
        self.pool = BlockPool(config.num_blocks)
        self.cache = PrefixCache(self.pool)
        self.lora = LoraSlots(config.lora_slots, config.adapters)
        self.metrics = SchedulerMetrics() if metrics else None
        self.step_no = 0
        self.seqs: dict[str, Seq] = {}
        self.queue: OrderedDict[str, Seq] = OrderedDict()
        self.running: OrderedDict[str, Seq] = OrderedDict()  # admission order: newest last
        self.prefilling: OrderedDict[str, Seq] = OrderedDict()
        self.decoding: dict[str, Seq] = {}
        self._finish_heap: list[tuple[int, int, int, str]] = []  # (step, admission no., epoch, id)
        self._grow_heap: list[tuple[int, int, str]] = []  # max-utilization: step at which a block is needed
        self.counts = {"admitted": 0, "rejected": 0, "preempted": 0, "finished": 0, "cancelled": 0}
        # blocks the executor holds outside this accounting (the TensorRT-LLM adapter's live bound): never admitted
        self.outside_blocks = 0
        self.slot_hits = 0  # admissions whose adapter was already resident in a slot (no load)
        self.slot_wait_s = 0.0  # clock seconds requests waited with KV available but no LoRA slot
        # sum over decoding requests of (prompt + gen_base - 1 - dec_base): their attended context at step t
        # is that plus t each, so the simulator's step-time model costs O(1) per step, not O(running)
        self._decode_ctx = 0
        # admission is skipped until what could let a queued request in changed (blocks, slot, queue, prefix, bound)
        self._changed = 0
        self.queued_tokens = 0  # prompt tokens waiting in the queue (the router's load signal)
        self._admit_seen: tuple[int, int, int] | None = None
        self._admit_budget = config.token_budget  # vLLM v1: the step's tokens left for admitted chunks

    # ----------------------------------------------------------------------------------------------- public API
    def submit(self, req: Request) -> SubmitResult:
        if req.id in self.seqs:
            raise InputError(f"request id {req.id!r} submitted twice")
        reason = self._reject_reason(req)
        seq = Seq(req, num_block_keys(req, self.config.tokens_per_block))
        self.seqs[req.id] = seq
        if reason is not None:
            seq.state = "rejected"
            self.counts["rejected"] += 1
            if self.metrics:
                self.metrics.rejected.inc()
            return SubmitResult("rejected", reason)
        seq.queued_step = self.step_no
        seq.queued_at = self.clock()
        # vLLM v1 admits from its waiting queue inside schedule(), after the running requests had their turn
        direct = not self.policy.alloc_per_step and not self.queue and len(self.running) < self.config.max_running
        if direct and self._try_admit(seq):
            return SubmitResult("admitted")
        self.queue[req.id] = seq
        self.queued_tokens += seq.prompt_len
        self._changed += 1
        return SubmitResult("queued")

    def step(self) -> StepPlan:
        """``schedule`` then ``update``: decide this step's work and apply it as if the executor ran it."""
        return self.update(self.schedule())

    def schedule(self) -> StepPlan:
        """Decide one step: admit (KV capacity, then LoRA slot), grow or preempt (max-utilization), then fill
        the token budget with every decode token and prefill chunks in admission order. vLLM v1
        (``Scheduler.schedule``) goes the other way round: the running requests get their blocks and tokens first
        (preempting the newest when short), and the waiting queue is admitted only with the budget left and only
        in a step that preempted nobody. Nothing is computed yet: ``update(plan)`` applies the plan."""
        self.step_no += 1
        t = self.step_no
        plan = StepPlan(t)
        running_first = self.policy.alloc_per_step
        if not running_first:
            plan.admitted = self.admit()
        if self.policy.preempts:
            self._grow(plan, t)
        plan.decode = list(self.decoding)
        # vLLM v1's allocation may preempt prefilling requests: walk a copy then
        prefilling = list(self.prefilling.values()) if running_first else self.prefilling.values()
        budget = self._plan_chunks(prefilling, plan, t, self.config.token_budget - len(plan.decode))
        if running_first and not plan.preempted and budget > 0:
            self._admit_budget = budget
            plan.admitted = self.admit()
            budget = self._plan_chunks([self.seqs[r] for r in plan.admitted], plan, t, budget)
        if plan.preempted and running_first:  # a chunk's allocation preempted planned work
            plan.decode = [r for r in plan.decode if self.seqs[r].decoding]
            kept = [c for c in plan.context if self.seqs[c[0]].state == "running"]
            budget += sum(c[2] for c in plan.context) - sum(c[2] for c in kept)
            plan.context = kept
        plan.context_tokens = self.config.token_budget - len(plan.decode) - budget
        plan.decode_context = self.decode_context_sum(t)  # exactly plan.decode's requests decode now
        return plan

    def _plan_chunks(self, prefilling: Iterable[Seq], plan: StepPlan, t: int, budget: int) -> int:
        """Prefill chunks in order while ``budget`` lasts; returns the budget left."""
        for seq in prefilling:
            if budget <= 0:
                break
            if seq.state != "running":
                continue
            n = min(seq.prompt_len - seq.computed, budget)
            if self.policy.alloc_per_step and not self._cover(seq, seq.computed + n, plan, t):
                break  # vLLM v1: the chunk's blocks do not fit even after preempting; the rest waits too
            plan.context.append((seq.req.id, seq.computed, n))
            budget -= n
        return budget

    def update(self, plan: StepPlan) -> StepPlan:
        """Apply ``plan``: prefill chunks computed, the last chunk's first token, one token per decoding request;
        requests that reach their cap finish (``plan.finished``). A prompt's full blocks become findable by other
        requests when its context completes (TensorRT-LLM ``KVCacheManager.update_resources`` stores context blocks
        once ``context_remaining_length`` is 0, as the adapter's ``context_done``), or chunk by chunk for vLLM v1
        (its ``cache_blocks`` after each step)."""
        t = plan.step
        for rid, _, n in plan.context:
            seq = self.seqs[rid]
            if seq.state != "running":
                continue  # preempted after it was planned
            seq.computed += n
            if self.policy.alloc_per_step or seq.computed == seq.prompt_len:
                self._register(seq)
            if seq.computed == seq.prompt_len:
                self._start_decode(seq, plan, t)
        heap = self._finish_heap
        while heap and heap[0][0] <= t:
            _, _, epoch, rid = heapq.heappop(heap)
            seq = self.seqs[rid]
            if seq.epoch == epoch and seq.decoding:
                self._end(seq, "finished")
                plan.finished.append(rid)
        if self.metrics:
            self.metrics.observe_step(self, plan)
        return plan

    def _start_decode(self, seq: Seq, plan: StepPlan, t: int) -> None:
        """The last prefill chunk ran: it produced the first (or, after a recompute, the next) token."""
        del self.prefilling[seq.req.id]
        if seq.gen_base == 0:
            plan.first_token.append(seq.req.id)
        seq.gen_base += 1
        seq.dec_base = t
        if seq.gen_base >= seq.req.max_new_tokens:
            self._end(seq, "finished")
            plan.finished.append(seq.req.id)
            return
        seq.decoding = True
        self.decoding[seq.req.id] = seq
        self._decode_ctx += seq.req.prompt_tokens + seq.gen_base - 1 - seq.dec_base
        plan.started_decode.append(seq.req.id)
        # ties end in admission order, as the TensorRT-LLM adapter ends them (the free order is the LRU order)
        heapq.heappush(self._finish_heap, (t + seq.req.max_new_tokens - seq.gen_base, seq.order, seq.epoch, seq.req.id))
        if self.policy.preempts:
            self._push_grow(seq)

    def context_done(self, request_id: str) -> None:
        """The executor ran this request's prefill (TensorRT-LLM adapter): its prompt blocks become findable."""
        seq = self._get(request_id)
        if seq.state == "running" and seq.computed < seq.prompt_len:
            seq.computed = seq.prompt_len
            self._register(seq)

    def finish(self, request_id: str) -> None:
        """The request stopped early (EOS): free its blocks and slot."""
        seq = self._get(request_id)
        if seq.state != "running":
            raise InputError(f"request {request_id!r} is {seq.state}, not running; only running requests finish")
        self._end(seq, "finished")
        if self.metrics:  # the gauges show the freed blocks now, not at the next step
            self.metrics.observe_step(self)

    def cancel(self, request_id: str) -> None:
        """Drop a queued or running request (a client that went away): its blocks and slot are freed, a LoRA-slot
        wait it was in counts in ``slot_wait_s``, and the gauges show it now (no step may follow on an idle server)."""
        seq = self._get(request_id)
        if seq.state == "queued":
            self._end_slot_wait(seq)
            del self.queue[request_id]
            self.queued_tokens -= seq.prompt_len
            self._changed += 1
            seq.state = "cancelled"
            self.counts["cancelled"] += 1
        elif seq.state == "running":
            self._end(seq, "cancelled")
        else:
            raise InputError(f"request {request_id!r} is already {seq.state}")
        if self.metrics:
            self.metrics.observe_step(self)

    def state(self, request_id: str) -> str:
        return self._get(request_id).state

    def capacity_blocks(self) -> int:
        return self.config.num_blocks

    def blocks_needed(self, req: Request) -> int:
        return -(-req.total_tokens // self.config.tokens_per_block)

    def quiet_steps(self) -> int:
        """How many of the next steps are certainly pure decode with nothing to decide (nothing prefilling or
        admissible, no cap reached, no block needed); the simulator replays those with ``skip``, not ``step``."""
        if self.prefilling or not self.decoding:
            return 0
        nxt_budget = self.config.token_budget - len(self.decoding) if self.policy.alloc_per_step else self._admit_budget
        if self.queue and self._admit_seen != self._admit_key(nxt_budget):
            return 0
        nxt = min([self._finish_heap[0][0] if self._finish_heap else 1 << 62, *(h[0] for h in self._grow_heap[:1])])
        return max(0, nxt - self.step_no - 1)

    def skip(self, steps: int) -> None:
        """Advance ``steps`` quiet steps (at most ``quiet_steps()``): every decoding request gains one token per
        step, which ``Seq.generated`` derives from the step number, so only the counter moves."""
        if not 0 <= steps <= self.quiet_steps():
            raise InputError(f"skip({steps}): only {self.quiet_steps()} quiet steps follow")
        self.step_no += steps

    def decode_context_sum(self, step: int) -> int:
        """Context tokens the decoding requests attend to in step ``step`` (prompt + generated before it)."""
        return self._decode_ctx + len(self.decoding) * step

    @property
    def used_blocks(self) -> int:
        return self.config.num_blocks - self.cache.available

    # -------------------------------------------------------------------------------------------- admission
    def _reject_reason(self, req: Request) -> RejectReason | None:
        return reject_reason(req, self.config, self.policy.reject_never_fit, self.lora.known, self.lora.num_slots)

    def admit(self) -> list[str]:
        """The capacity stage alone: admit queued requests per the policy; returns their ids in order (the
        TensorRT-LLM adapter calls this, ``schedule`` calls it first)."""
        if not self.queue or self._admit_seen == self._admit_key(self._admit_budget):
            return []  # nothing that could let a request in changed since an admission pass admitted nobody
        admitted: list[str] = []
        cap = self.config.max_running
        skip_lora = self.policy.skip_lora_blocked

        def room() -> bool:
            return len(self.running) < cap

        def try_admit(seq: Seq) -> bool:  # True: the walk goes on
            if self._try_admit(seq):
                admitted.append(seq.req.id)
                return True
            # vLLM v1: a request whose adapter would exceed max_loras is skipped, before its KV is looked at
            return skip_lora and seq.req.adapter is not None and not self.lora.can_acquire(seq.req.adapter)

        self.policy.select(self.queue.values(), try_admit, room)
        for rid in admitted:
            self.queued_tokens -= self.queue.pop(rid).prompt_len
        self._admit_seen = None if admitted else self._admit_key(self._admit_budget)
        return admitted

    def _admit_key(self, budget: int) -> tuple[int, int, int]:
        return (self._changed, self.outside_blocks, budget)  # an admission pass's outcome depends on these

    def _try_admit(self, seq: Seq) -> bool:
        """Admit ``seq`` if its blocks (and LoRA slot) are available now; allocate them."""
        tpb = self.config.tokens_per_block
        # never hit the block holding the last prompt token: at least one token must be computed to sample
        usable = (seq.prompt_len - 1) // tpb
        room = self.cache.available - self.outside_blocks
        if admit_lower_bound(self.policy, seq, usable, tpb, self._admit_budget) > room:
            return self._end_slot_wait(seq)  # a lower bound first: most fail here, O(1), before any hashing
        hits, idle = self.cache.match(seq_keys(seq, tpb), usable) if seq.num_keys else ([], 0)
        if self.policy.reserve_to_completion:
            tokens = seq.prompt_len + seq.req.max_new_tokens - seq.gen_base
        elif self.policy.alloc_per_step:  # vLLM v1: blocks for this step's chunk only, hits included
            tokens = max(min(seq.prompt_len, len(hits) * tpb + self._admit_budget), len(hits) * tpb)
        else:
            tokens = seq.prompt_len
        total = max(-(-tokens // tpb), len(hits))
        fresh = total - len(hits)
        cost = fresh + idle if self.policy.credit_prefix else total
        if cost > room:
            return self._end_slot_wait(seq)
        if not self.lora.can_acquire(seq.req.adapter):
            if seq.slot_wait_since < 0:
                seq.slot_wait_since = self.clock()
            return False
        self._end_slot_wait(seq)
        if seq.req.adapter is not None and seq.req.adapter in self.lora.slot_of:
            self.slot_hits += 1
        self.cache.take_hits(hits, min(seq.num_keys, usable))
        seq.blocks = hits + self.cache.allocate(fresh)
        seq.hits = len(hits)
        seq.computed = len(hits) * tpb
        seq.registered = len(hits)
        seq.slot = self.lora.acquire(seq.req.adapter)
        seq.state = "running"
        seq.skips = 0
        self.running[seq.req.id] = seq
        self.prefilling[seq.req.id] = seq
        self.counts["admitted"] += 1
        seq.order = self.counts["admitted"]
        if self.metrics:
            self.metrics.admitted.inc()
            self.metrics.queue_wait_steps.observe(self.step_no - seq.queued_step)
            self.metrics.queue_wait_seconds.observe(self.clock() - seq.queued_at)
        return True

    def _end_slot_wait(self, seq: Seq) -> bool:
        """A LoRA-slot wait (``slot_wait_s``: KV available, no slot) ends: admitted, or the KV is short now."""
        if seq.slot_wait_since >= 0:
            self.slot_wait_s += self.clock() - seq.slot_wait_since
            seq.slot_wait_since = -1.0
        return False

    def _register(self, seq: Seq) -> None:
        full = min(seq.computed // self.config.tokens_per_block, seq.num_keys)
        if full > seq.registered:
            new = self.cache.register_many(seq.blocks, seq_keys(seq, self.config.tokens_per_block),
                                           seq.registered, full)
            if self.policy.credit_prefix:
                self._changed += new  # a new cached prefix lowers what a queued request costs
            seq.registered = full

    # ------------------------------------------------------------------------------------------------ ending
    def _release(self, seq: Seq) -> None:
        self._changed += 1  # blocks and a slot come back
        rid = seq.req.id
        self.running.pop(rid, None)
        self.prefilling.pop(rid, None)
        if self.decoding.pop(rid, None) is not None:
            self._decode_ctx -= seq.req.prompt_tokens + seq.gen_base - 1 - seq.dec_base
        seq.decoding = False
        seq.epoch += 1
        self.cache.free(seq.blocks)
        seq.blocks = []
        self.lora.release(seq.req.adapter)
        seq.slot = -1

    def _end(self, seq: Seq, state: str) -> None:
        self._release(seq)
        seq.state = state
        self.counts[state] += 1

    def _get(self, request_id: str) -> Seq:
        try:
            return self.seqs[request_id]
        except KeyError:
            raise InputError(f"unknown request id {request_id!r}") from None
