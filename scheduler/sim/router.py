"""Routing arrivals to replicas.

- ``round-robin``: arrival i goes to replica i mod n.
- ``prefix-affinity``: the replica whose prefix cache holds the longest prefix of the request, among replicas
  within 1.25x + 8 requests of the least loaded; no cached prefix anywhere -> the least loaded.
- ``cache-aware`` (SGLang's cache-aware router, ``sgl-router`` ``CacheAwarePolicy``): while the load is balanced,
  the replica with the longest cached prefix (ties: the least loaded); when it is imbalanced -- the most loaded
  replica holds more than ``balance_abs`` requests above the least loaded AND more than ``balance_rel`` times
  it -- the least loaded replica, whatever its cache. Load is queued + running requests (SGLang counts a
  worker's in-flight requests the same way).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..prefix_cache import block_keys
from ..request import Request
from ..scheduler import Scheduler

ROUTERS = ("round-robin", "prefix-affinity", "cache-aware")


class Router:
    def __init__(self, name: str, scheds: Sequence[Scheduler], balance_abs: int = 32,
                 balance_rel: float = 1.5) -> None:
        self.name = name
        self.scheds = list(scheds)
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel

    def pick(self, req: Request, i: int) -> int:
        n = len(self.scheds)
        if self.name == "round-robin" or n == 1:
            return i % n
        loads = [len(s.queue) + len(s.running) for s in self.scheds]
        keys = block_keys(req, self.scheds[0].config.tokens_per_block)
        hits = [len(s.cache.match(keys)[0]) if keys else 0 for s in self.scheds]
        least = min(range(n), key=lambda k: (loads[k], k))
        if self.name == "prefix-affinity":
            bound = loads[least] * 1.25 + 8
            cands = [k for k in range(n) if loads[k] <= bound]
            return max(cands, key=lambda k: (hits[k], -loads[k], -k))
        if max(loads) - loads[least] > self.balance_abs and max(loads) > self.balance_rel * loads[least]:
            return least  # imbalanced: load wins over affinity
        return max(range(n), key=lambda k: (hits[k], -loads[k], -k))
