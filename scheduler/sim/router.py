"""Routing arrivals to replicas.

- ``round-robin``: arrival i goes to replica i mod n.
- ``prefix-affinity``: the replica whose prefix cache holds the longest prefix of the request, among replicas
  within 1.25x + 8 requests of the least loaded; no cached prefix anywhere -> the least loaded.
- ``cache-aware`` (after SGLang's cache-aware router, ``sgl-router`` ``CacheAwarePolicy``), with load = KV demand
  in tokens (blocks held x block size + prompt tokens queued: what a reserve-to-completion replica makes a new
  request wait for) and "can start" = the replica's queue is empty and its free blocks hold the request's
  reservation (prompt + cap), i.e. it would admit the request at once:
  1. imbalanced -- the busiest replica's load exceeds the idlest one's by more than ``balance_abs`` of one
     replica's KV capacity AND by more than ``balance_rel`` times (SGLang's absolute and relative thresholds) --
     and the idlest can start the request: the idlest;
  2. else the replica with the longest cached prefix, if that prefix covers at least ``cache_threshold`` of the
     prompt (SGLang's ``cache_threshold``) and that replica can start it or carries no more than the mean load;
  3. else round-robin.
  Departures from SGLang, measured on both bundled traces (bench/RESULTS.md, "Scheduler, issue 13, round 2"):
  SGLang sends every low-match request to the least loaded worker and balances whenever the thresholds are
  crossed; here a request moves off round-robin only where it starts at once (step 1) or reuses a cached prefix
  without joining a busier-than-average replica (step 2). Under overload every least-loaded rule measured below
  round-robin on goodput: balancing spreads the waiting over every replica, so fewer requests meet their SLO.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..prefix_cache import block_keys
from ..request import Request
from ..scheduler import Scheduler

ROUTERS = ("round-robin", "prefix-affinity", "cache-aware")


class Router:
    def __init__(self, name: str, scheds: Sequence[Scheduler], balance_abs: float = 0.25,
                 balance_rel: float = 1.5, cache_threshold: float = 0.5) -> None:
        """``balance_abs``: a fraction of one replica's KV capacity (tokens); ``balance_rel``: a ratio."""
        self.name = name
        self.scheds = list(scheds)
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.cache_threshold = cache_threshold

    def pick(self, req: Request, i: int) -> int:
        n = len(self.scheds)
        if self.name == "round-robin" or n == 1:
            return i % n
        keys = block_keys(req, self.scheds[0].config.tokens_per_block)
        hits = [len(s.cache.match(keys)[0]) if keys else 0 for s in self.scheds]
        if self.name == "prefix-affinity":
            loads = [len(s.queue) + len(s.running) for s in self.scheds]
            least = min(range(n), key=lambda k: (loads[k], k))
            bound = loads[least] * 1.25 + 8
            cands = [k for k in range(n) if loads[k] <= bound]
            return max(cands, key=lambda k: (hits[k], -loads[k], -k))
        return self._cache_aware(req, i, hits)

    def _cache_aware(self, req: Request, i: int, hits: list[int]) -> int:
        n = len(self.scheds)
        cfg = self.scheds[0].config
        tpb = cfg.tokens_per_block
        # KV demand, not request count: one Mooncake prompt (1k-126k tokens) weighs what it costs a replica
        work = [s.used_blocks * tpb + s.queued_tokens for s in self.scheds]
        need = -(-req.total_tokens // tpb)
        can = [not s.queue and s.cache.available - s.outside_blocks >= need for s in self.scheds]
        least = min(range(n), key=lambda k: (work[k], k))
        hi, lo = max(work), work[least]
        if hi - lo > self.balance_abs * cfg.num_blocks * tpb and hi > self.balance_rel * lo and can[least]:
            return least  # imbalanced, and the idlest replica takes the request at once
        best = max(range(n), key=lambda k: (hits[k], -work[k], -k))
        if hits[best] * tpb >= self.cache_threshold * req.prompt_tokens and (can[best] or
                                                                           work[best] * n <= sum(work)):
            return best
        return i % n
