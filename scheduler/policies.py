"""Admission policies: which queued requests become running this step, and what their admission reserves.

- ``fcfs-no-evict`` -- TensorRT-LLM's ``GUARANTEED_NO_EVICT``: a request is admitted only if the blocks for its
  whole completion (prompt + max_new_tokens) fit; requests are taken in arrival order and admission stops at the
  first one that does not fit (head-of-line blocking). Like TensorRT-LLM up to 1.2 it never rejects a request
  that can never fit: such a request sits at the head of the queue forever and blocks everything behind it (the
  simulator bounds its run and reports those requests as stuck). Prefix blocks another request already holds are
  not credited in the admission check (TensorRT-LLM's remaining-blocks-to-completion count does not subtract
  reused blocks); they are still shared physically.
- ``max-utilization`` -- TensorRT-LLM's ``MAX_UTILIZATION`` / vLLM's default: admit when the prompt's blocks fit,
  grow blocks one at a time while decoding, and when the pool runs dry preempt the newest running request (its
  blocks are freed and it is recomputed later). Requests that can never fit are rejected so the comparison is
  about preemption, not hangs.
- ``cache-aware`` -- this project's: reserve to completion (never evicts what it admitted), count prefix blocks
  that are already cached once, reject a never-fit request at submission with a reason, and skip ahead of a
  request that does not fit *now* by at most ``skip_window`` queue entries. Each time a request is passed over
  its ``skips`` count grows; at ``max_skips`` it stops all further skipping until it is admitted, which happens
  once running requests finish (they all complete, as nothing is evicted) -- so no request starves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
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
    "fcfs-no-evict": Policy("fcfs-no-evict", reserve_to_completion=True, credit_prefix=False,
                            reject_never_fit=False, preempts=False),
    "max-utilization": Policy("max-utilization", reserve_to_completion=False, credit_prefix=True,
                              reject_never_fit=True, preempts=True),
    "cache-aware": Policy("cache-aware", reserve_to_completion=True, credit_prefix=True, reject_never_fit=True,
                          preempts=False, skip_window=16, max_skips=32),
}


def get_policy(name: str, skip_window: int | None = None, max_skips: int | None = None) -> Policy:
    if name not in POLICIES:
        raise InputError(f"unknown policy {name!r}; use one of {', '.join(POLICIES)}")
    p = POLICIES[name]
    if skip_window is not None or max_skips is not None:
        from dataclasses import replace

        p = replace(p, skip_window=p.skip_window if skip_window is None else skip_window,
                    max_skips=p.max_skips if max_skips is None else max_skips)
    return p
