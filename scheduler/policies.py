"""Admission policies: which queued requests become running this step, and what their admission reserves.

Baselines (each a ``Policy`` with the upstream semantics it models; the hand-computed cases are in
``tests/scheduler/test_policies_13.py``):

- ``trtllm-1.2-no-evict`` (alias ``fcfs-no-evict``) -- TensorRT-LLM <= 1.2 ``GUARANTEED_NO_EVICT``
  (``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp`` ``GuaranteedNoEvictScheduler``, bound in
  ``tensorrt_llm/_torch/pyexecutor/scheduler.py`` ``BindCapacityScheduler``): a request is admitted only if the
  blocks for its whole completion (prompt + max_tokens) fit; requests are taken in arrival order and admission
  stops at the first one that does not fit (head-of-line blocking). It never rejects a request that can never
  fit: such a request sits at the head of the queue forever (the simulator bounds its run and reports them as
  unserved). Prefix blocks another request holds are not credited (its remaining-blocks-to-completion count does
  not subtract reused blocks); they are still shared physically.
- ``trtllm-main-no-evict`` -- TensorRT-LLM ``main`` (late 2026) ``GUARANTEED_NO_EVICT``: the same arrival-order,
  head-of-line loop, but a request that needs more blocks than the whole cache is rejected, and prefix blocks
  already cached are credited (only the blocks it adds count).
- ``max-utilization`` -- TensorRT-LLM ``MAX_UTILIZATION`` (``MaxUtilizationScheduler``): admit when the
  prompt's blocks fit, grow blocks one at a time while decoding, and when the pool runs dry pause (free and
  later recompute) the newest running request. Requests that can never fit are rejected so the comparison is
  about preemption, not hangs.
- ``vllm-v1`` -- vLLM v1 (``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule``, ``vllm/v1/core/
  kv_cache_manager.py`` ``allocate_slots``, ``vllm/v1/core/block_pool.py`` ``FreeKVCacheBlockQueue``): blocks are
  allocated per step for the tokens scheduled in that step (a prefill chunk, one decode token); the running
  requests are served first (their next block, their decode token or prefill chunk), and the waiting queue is
  admitted only after them, with the token budget they left and only in a step that preempted nobody (a new
  request waits in that queue until the next step, never admitted at submission); the waiting queue is strict
  FCFS (it stops at the first request whose chunk does not fit) except that a request whose LoRA adapter gets no
  slot is passed over, whether its chunk fits or not (vLLM's ``max_loras`` check comes before the KV lookup and
  ``continue``s to the next waiting request; ``skip_lora_blocked``), a running request that cannot get its next
  block preempts the newest running request by recompute, and cached blocks are evicted least
  recently freed first. One difference: vLLM keeps ONE free queue over all free blocks, so it may evict a cached
  block while never-cached free blocks wait further down the queue; ``PrefixCache`` hands out never-cached free
  blocks first, then evicts cached-free ones in LRU order (it keeps cached prefixes at least as long).
  A preempted request's computed blocks stay cached-free for its own recompute (vLLM finds them by their tokens;
  here under keys only that request finds, ``prefix_cache.keep_own_blocks``), in ``max-utilization`` too.
- ``cache-aware`` -- this project's: reserve to completion (never evicts what it admitted), count prefix blocks
  that are already cached once, reject a never-fit request at submission with a reason, and skip ahead of a
  request that does not fit *now* by at most ``skip_window`` queue entries. Each time a request is passed over
  its ``skips`` count grows; at ``max_skips`` it stops all further skipping until it is admitted, which happens
  once running requests finish (they all complete, as nothing is evicted) -- so no request starves.

Reserve-to-completion policies reserve to the request's cap (``max_tokens``), the only length a real scheduler
knows; the request may end earlier at end-of-sequence, which frees the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from trtforge.build_engine.core.errors import InputError


class Skippable(Protocol):
    """What ``Policy.select`` needs of a queue entry (a ``Seq``, or the TensorRT-LLM adapter's ``Candidate``)."""

    skips: int


S = TypeVar("S", bound=Skippable)


@dataclass(frozen=True)
class Policy:
    name: str
    reserve_to_completion: bool
    credit_prefix: bool
    reject_never_fit: bool
    preempts: bool
    skip_window: int = 0
    max_skips: int = 0
    alloc_per_step: bool = False  # blocks allocated per scheduled chunk / token (vLLM v1), not per prompt
    skip_lora_blocked: bool = False  # a queued request whose adapter gets no slot is passed over (vLLM v1)

    def select(self, queue: Iterable[S], try_admit: Callable[[S], bool], room: Callable[[], bool]) -> None:
        """Walk ``queue`` in order calling ``try_admit`` (which admits when it fits) while ``room()`` holds."""
        if self.skip_window <= 0:
            for seq in queue:
                if not room() or not try_admit(seq):
                    return
            return
        blocked: list[S] = []
        scanned_past = 0
        for seq in queue:
            if not room():
                return
            if blocked:
                if scanned_past >= self.skip_window:
                    return
                scanned_past += 1
            if try_admit(seq):
                aged = False
                for b in blocked:  # it went ahead of these: they age
                    b.skips += 1
                    aged |= b.skips >= self.max_skips
                if aged:
                    return
                continue
            if seq.skips >= self.max_skips:
                return  # aged out: nobody may pass it any more
            blocked.append(seq)


POLICIES: dict[str, Policy] = {
    "trtllm-1.2-no-evict": Policy("trtllm-1.2-no-evict", reserve_to_completion=True, credit_prefix=False,
                                  reject_never_fit=False, preempts=False),
    "trtllm-main-no-evict": Policy("trtllm-main-no-evict", reserve_to_completion=True, credit_prefix=True,
                                   reject_never_fit=True, preempts=False),
    "max-utilization": Policy("max-utilization", reserve_to_completion=False, credit_prefix=True,
                              reject_never_fit=True, preempts=True),
    "vllm-v1": Policy("vllm-v1", reserve_to_completion=False, credit_prefix=True, reject_never_fit=True,
                      preempts=True, alloc_per_step=True, skip_lora_blocked=True),
    "cache-aware": Policy("cache-aware", reserve_to_completion=True, credit_prefix=True, reject_never_fit=True,
                          preempts=False, skip_window=16, max_skips=32),
}
# older names (the demo and earlier reports use them): same semantics, reported under the name asked for
ALIASES: dict[str, str] = {"fcfs-no-evict": "trtllm-1.2-no-evict"}
POLICY_NAMES: tuple[str, ...] = (*POLICIES, *ALIASES)


def get_policy(name: str, skip_window: int | None = None, max_skips: int | None = None) -> Policy:
    if name not in POLICY_NAMES:
        raise InputError(f"unknown policy {name!r}; use one of {', '.join(POLICY_NAMES)}")
    p = POLICIES[ALIASES.get(name, name)]
    if name in ALIASES:
        p = replace(p, name=name)
    if skip_window is not None or max_skips is not None:
        p = replace(p, skip_window=p.skip_window if skip_window is None else skip_window,
                    max_skips=p.max_skips if max_skips is None else max_skips)
    return p
