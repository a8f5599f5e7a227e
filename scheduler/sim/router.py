"""Routing arrivals to replicas.

- ``round-robin``: arrival i goes to replica i mod n.
- ``prefix-affinity``: the replica whose prefix cache holds the longest prefix of the request, among replicas
  within 1.25x + 8 requests of the least loaded; no cached prefix anywhere -> the least loaded.
- ``cache-aware`` (after SGLang's cache-aware router, ``sgl-router`` ``CacheAwarePolicy``): when the load is
  imbalanced -- the most loaded replica holds more than ``balance_abs`` requests above the least loaded AND more
  than ``balance_rel`` times it (SGLang's two thresholds; requests in flight, as SGLang counts them) -- the least
  loaded replica, whatever its cache. Otherwise the replica with the longest cached prefix, if that prefix covers
  at least ``cache_threshold`` of the prompt (SGLang's ``cache_threshold``) and that replica's KV demand (blocks
  held + prompt tokens queued) is not above the replicas' mean; else round-robin. Two departures from SGLang,
  both measured on the Mooncake trace (bench/RESULTS.md): SGLang sends a low-match request to the least loaded
  worker, which gave lower goodput than round-robin here, and it has no KV-demand condition on affinity.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..prefix_cache import block_keys
from ..request import Request
from ..scheduler import Scheduler

ROUTERS = ("round-robin", "prefix-affinity", "cache-aware")


class Router:
    def __init__(self, name: str, scheds: Sequence[Scheduler], balance_abs: int = 32,
                 balance_rel: float = 1.5, cache_threshold: float = 0.5) -> None:
        self.name = name
        self.scheds = list(scheds)
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.cache_threshold = cache_threshold

    def pick(self, req: Request, i: int) -> int:
        n = len(self.scheds)
        if self.name == "round-robin" or n == 1:
            return i % n
        loads = [len(s.queue) + len(s.running) for s in self.scheds]
        keys = block_keys(req, self.scheds[0].config.tokens_per_block)
        hits = [len(s.cache.match(keys)[0]) if keys else 0 for s in self.scheds]
        if self.name == "prefix-affinity":
            least = min(range(n), key=lambda k: (loads[k], k))
            bound = loads[least] * 1.25 + 8
            cands = [k for k in range(n) if loads[k] <= bound]
            return max(cands, key=lambda k: (hits[k], -loads[k], -k))
        # "least loaded" by KV demand (blocks held + prompts waiting), not by request count: one long prompt
        # weighs what it costs a replica (Mooncake prompts span 1k-126k tokens)
        tpb = self.scheds[0].config.tokens_per_block
        work = [s.used_blocks * tpb + s.queued_tokens for s in self.scheds]
        least = min(range(n), key=lambda k: (loads[k], k))
        if max(loads) - min(loads) > self.balance_abs and max(loads) > self.balance_rel * min(loads):
            return least  # imbalanced: load wins over affinity
        best = max(range(n), key=lambda k: (hits[k], -work[k], -k))
        if hits[best] * tpb < self.cache_threshold * req.prompt_tokens or work[best] * n > sum(work):
            return i % n  # too little cached anywhere, or only on a busier-than-average replica: round-robin
        return best
