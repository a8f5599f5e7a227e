"""What a serving request asks of the scheduler.

``block_hashes`` are content ids of the prompt's leading blocks of ``hash_block_tokens`` tokens each (Mooncake's
``hash_ids`` use 512-token blocks; equal ids mean equal token content *and* equal prefix before them). They let
the prefix cache share KV blocks between requests without seeing token ids. ``hashes_from_tokens`` makes them from
real token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtforge.build_engine.core.errors import InputError


@dataclass(frozen=True)
class Request:
    """An inference request. ``arrival`` is in seconds (the simulator's clock); the scheduler does not read it.

    ``max_new_tokens`` is the client's cap (``max_tokens``), not the output length: the request may end earlier at
    end-of-sequence, which only the executor (or the simulator) learns, through ``Scheduler.finish``.
    """

    id: str
    arrival: float
    prompt_tokens: int
    max_new_tokens: int
    block_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 512
    adapter: str | None = None
    cache_salt: str | None = None  # vLLM's ``cache_salt``: requests with different salts share no prefix blocks

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise InputError(f"request {self.id}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.max_new_tokens < 1:
            raise InputError(f"request {self.id}: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.hash_block_tokens < 1:
            raise InputError(f"request {self.id}: hash_block_tokens must be >= 1")

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.max_new_tokens

    @property
    def max_tokens(self) -> int:
        """The client's cap (OpenAI ``max_tokens``); the request may stop earlier at end-of-sequence."""
        return self.max_new_tokens


def hashes_from_tokens(token_ids: Sequence[int], block_tokens: int) -> tuple[int, ...]:
    """Chained content ids of the full ``block_tokens``-token blocks of ``token_ids`` (a partial tail is not hashed).

    Each id covers its block *and* everything before it, like Mooncake's ``hash_ids``.
    """
    out: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        parent = hash((parent, tuple(token_ids[start:start + block_tokens])))
        out.append(parent)
    return tuple(out)


class Seq:
    """The scheduler's mutable state of one request (internal; ``Scheduler.state`` exposes what callers need).

    ``prompt_len`` is the prompt to (re)compute: the original prompt, or prompt + generated tokens after a
    recompute preemption. While decoding, generated tokens after step ``t`` are ``gen_base + t - dec_base``
    (computed, not counted per step, so a step costs O(requests that change) rather than O(running)).
    """

    __slots__ = ("req", "state", "blocks", "keys", "num_keys", "prompt_len", "computed", "gen_base", "dec_base",
                 "skips", "epoch", "registered", "slot", "queued_step", "queued_at", "decoding", "hits",
                 "slot_wait_since", "order")

    def __init__(self, req: Request, num_keys: int, keys: tuple[int, ...] | None = None) -> None:
        """``keys``: the prefix-cache keys of the prompt's full blocks, hashed when first needed (``None`` until
        then: most queued requests of an overloaded replay are never admitted); ``num_keys`` is their count."""
        self.req = req
        self.state = "queued"  # queued | running | finished | cancelled | rejected
        self.blocks: list[int] = []
        self.keys = keys
        self.num_keys = num_keys
        self.prompt_len = req.prompt_tokens
        self.computed = 0
        self.gen_base = 0  # tokens generated before the current decode phase began
        self.dec_base = 0
        self.skips = 0
        self.epoch = 0
        self.registered = 0
        self.slot = -1
        self.queued_step = 0
        self.queued_at = 0.0
        self.decoding = False
        self.hits = 0
        self.slot_wait_since = -1.0
        self.order = 0  # admission number (1, 2, ...: the scheduler's running order; re-admission renumbers)

    def generated(self, step: int) -> int:
        """Tokens generated after step ``step`` completed."""
        return self.gen_base + (step - self.dec_base) if self.decoding else self.gen_base
