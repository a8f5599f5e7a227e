"""The scheduler's plain data: its configuration, a submission's outcome and one step's plan."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Literal

from trtforge.build_engine.core.errors import InputError

from .policies import Policy
from .request import Request, Seq

RejectKind = Literal["kv-never-fits", "prompt-too-long", "unknown-adapter", "no-lora-slot"]


@dataclass(frozen=True)
class RejectReason:
    kind: RejectKind
    blocks_needed: int
    capacity_blocks: int
    max_seq_len: int
    message: str


@dataclass(frozen=True)
class SubmitResult:
    status: Literal["admitted", "queued", "rejected"]
    reason: RejectReason | None = None


@dataclass
class StepPlan:
    """One step's work. ``context`` holds (request id, first token index, tokens) prefill chunks."""

    step: int
    context: list[tuple[str, int, int]] = field(default_factory=list)
    decode: list[str] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    first_token: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    started_decode: list[str] = field(default_factory=list)  # finished their prefill this step, now decoding
    context_tokens: int = 0
    # context tokens the ``decode`` requests attend to in this step (``Scheduler.decode_context_sum`` when it was
    # planned: after ``update`` it counts the requests that just started decoding and misses those that ended)
    decode_context: int = 0

    @property
    def num_tokens(self) -> int:
        return self.context_tokens + len(self.decode)


@dataclass(frozen=True)
class SchedulerConfig:
    num_blocks: int
    tokens_per_block: int
    policy: str = "cache-aware"
    max_seq_len: int = 131072
    token_budget: int = 8192
    max_running: int = 256
    lora_slots: int = 0
    adapters: tuple[str, ...] = ()
    skip_window: int | None = None
    max_skips: int | None = None

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.tokens_per_block < 1:
            raise InputError(f"num_blocks ({self.num_blocks}) and tokens_per_block ({self.tokens_per_block}) must be "
                             ">= 1; give the KV cache at least one block")
        if self.max_running < 1 or self.token_budget < self.max_running:
            raise InputError(f"token_budget {self.token_budget} (simulate --token-budget) must be >= max_running "
                             f"{self.max_running} (--max-running) >= 1, so every decoding request gets its token "
                             "each step; raise the budget or lower max_running")


def reject_reason(req: Request, cfg: SchedulerConfig, reject_never_fit: bool, known: Collection[str],
                  num_slots: int) -> RejectReason | None:
    """Why ``req`` can never run under ``cfg`` (checked at submission), or None."""
    need = -(-req.total_tokens // cfg.tokens_per_block)  # integers: a cap of 10**400 overflowed a float
    if req.adapter is not None and req.adapter not in known:
        return RejectReason("unknown-adapter", need, cfg.num_blocks, cfg.max_seq_len,
                            f"request {req.id}: LoRA adapter {req.adapter!r} is not registered; load it "
                            f"(known: {', '.join(sorted(known)) or 'none'}) or drop the adapter")
    if req.adapter is not None and num_slots == 0:
        # it could never be admitted: without this it would sit at the head of the queue forever
        return RejectReason("no-lora-slot", need, cfg.num_blocks, cfg.max_seq_len,
                            f"request {req.id}: LoRA adapter {req.adapter!r} needs a LoRA slot but the engine "
                            "has 0 slots; build the engine with --lora-slots >= 1 or drop the adapter")
    if req.total_tokens > cfg.max_seq_len:
        return RejectReason("prompt-too-long", need, cfg.num_blocks, cfg.max_seq_len,
                            f"request {req.id}: prompt {req.prompt_tokens} + max_new_tokens "
                            f"{req.max_new_tokens} = {req.total_tokens} tokens exceeds the engine's max "
                            f"sequence length {cfg.max_seq_len}; shorten the prompt or lower max_new_tokens")
    if reject_never_fit and need > cfg.num_blocks:
        fit = cfg.num_blocks * cfg.tokens_per_block
        return RejectReason("kv-never-fits", need, cfg.num_blocks, cfg.max_seq_len,
                            f"request {req.id}: needs {need} KV blocks ({req.total_tokens} tokens) but the "
                            f"cache holds {cfg.num_blocks} blocks ({fit} tokens) even when empty; lower "
                            f"max_new_tokens or the prompt to <= {fit} tokens in total, use fp8 KV, a GPU "
                            f"with more memory, or more tensor parallelism")
    return None


def admit_lower_bound(policy: Policy, seq: Seq, usable: int, tpb: int, token_budget: int) -> int:
    """A lower bound on the blocks ``Scheduler._try_admit`` would charge ``seq``, without hashing or matching its
    prompt: the most prefix blocks it could hit is ``min(usable, seq.num_keys)`` (``h``), and the charge never
    grows with more hits. Reserve-to-completion: ceil(tokens / tpb) - h. vLLM v1 (this step's chunk):
    ceil(min(prompt, h * tpb + budget) / tpb) - h, non-increasing in h. 0 where no bound is known."""
    h = min(usable, seq.num_keys) if policy.credit_prefix else 0
    if policy.reserve_to_completion:
        return -(-(seq.prompt_len + seq.req.max_new_tokens - seq.gen_base) // tpb) - h
    if policy.alloc_per_step and policy.credit_prefix:
        return -(-min(seq.prompt_len, h * tpb + token_budget) // tpb) - h
    return 0
