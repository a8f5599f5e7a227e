"""The scheduler's plain data: its configuration, a submission's outcome and one step's plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trtforge.build_engine.core.errors import InputError

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
            raise InputError(f"token_budget ({self.token_budget}) must be >= max_running ({self.max_running}) >= 1 "
                             "so every decoding request gets its token each step")
