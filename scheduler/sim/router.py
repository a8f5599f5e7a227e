"""Routing arrivals to replicas.

- ``round-robin``: arrival i goes to replica i mod n.
- ``prefix-affinity``: the replica whose prefix cache holds the longest prefix of the request, among replicas
  within 1.25x + 8 requests of the least loaded; no cached prefix anywhere -> the least loaded.
- ``cache-aware`` (load-aware affinity after SGLang's cache-aware router, ``sgl-router`` ``CacheAwarePolicy``):
  round-robin, left only where that raises this request's chance of meeting its TTFT SLO. Per replica k:
  - ``low[k]``: a lower bound on the request's TTFT there: the prompt tokens k must prefill first (the rest of its
    prefilling requests, its queue) plus the request's own uncached prompt, at the step model's best prefill rate
    (a full chunk at context 0), ignoring any wait for KV blocks;
  - ``est[k]``: the same where k can start the request at once (its queue is empty and its free blocks hold the
    request's admission cost, prompt + cap less the cached prefix), else infinite (it waits for blocks, by how
    long only its running requests' ends tell).
  1. RR's replica r may meet the SLO (``low[r] <= slo``): r;
  2. r certainly misses it (``low[r] > slo``): among the replicas that start it within the SLO, the one with the
     longest cached prefix (then the lowest estimate); none: r.
  Affinity therefore acts only where round-robin certainly fails the request: following a cached prefix while
  round-robin's replica could still serve the request in time moved goodput by -13% with ONE early move on a
  hand-built 2-replica overload (tests/scheduler/test_router_13.py; bench/RESULTS.md "round 3").
  Why not SGLang's rule (balance whenever the load gap crosses its thresholds, else follow the longest prefix):
  at twice the traces' rate every replica is overloaded within a minute, all of the goodput is made before that,
  and a request moved off round-robin that would have met its SLO anyway only displaces a later arrival at the
  receiving replica; every variant that moved such requests lost as many or more rows to round-robin
  (bench/RESULTS.md, "Scheduler, issue 13, round 3", held-out windows included).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..prefix_cache import block_keys
from ..request import Request
from ..scheduler import Scheduler

ROUTERS = ("round-robin", "prefix-affinity", "cache-aware")


class Router:
    def __init__(self, name: str, scheds: Sequence[Scheduler], prefill_s_per_token: float = 0.0,
                 slo_ttft_s: float = 5.0) -> None:
        """``prefill_s_per_token``: the step model's best prefill time per token (the simulator passes it; 0 =
        no estimate: then no miss is certain and ``cache-aware`` is round-robin)."""
        self.name = name
        self.scheds = list(scheds)
        self.prefill_s_per_token = prefill_s_per_token
        self.slo_ttft_s = slo_ttft_s

    def pick(self, req: Request, i: int) -> int:
        n = len(self.scheds)
        if self.name == "round-robin" or n == 1:
            return i % n
        tpb = self.scheds[0].config.tokens_per_block
        keys = block_keys(req, tpb)
        if self.name == "cache-aware":  # what admission can use: never the block of the last prompt token
            keys = keys[:(req.prompt_tokens - 1) // tpb]
        matches = [s.cache.match(keys) if keys else ([], 0) for s in self.scheds]
        hits = [len(m[0]) for m in matches]
        if self.name == "prefix-affinity":
            loads = [len(s.queue) + len(s.running) for s in self.scheds]
            least = min(range(n), key=lambda k: (loads[k], k))
            bound = loads[least] * 1.25 + 8
            cands = [k for k in range(n) if loads[k] <= bound]
            return max(cands, key=lambda k: (hits[k], -loads[k], -k))
        return self._cache_aware(req, i % n, hits, [m[1] for m in matches])

    def _cache_aware(self, req: Request, r: int, hits: list[int], idle: list[int]) -> int:
        n = len(self.scheds)
        tpb = self.scheds[0].config.tokens_per_block
        need = -(-req.total_tokens // tpb)
        low: list[float] = []
        est: list[float] = []
        for k, s in enumerate(self.scheds):
            ahead = s.queued_tokens + sum(q.prompt_len - q.computed for q in s.prefilling.values())
            low.append((ahead + req.prompt_tokens - hits[k] * tpb) * self.prefill_s_per_token)
            # the admission cost of a reserve-to-completion policy that credits cached blocks (Scheduler._try_admit)
            cost = max(need, hits[k]) - hits[k] + idle[k]
            can = not s.queue and s.cache.available - s.outside_blocks >= cost
            est.append(low[-1] if can else float("inf"))
        slo = self.slo_ttft_s
        if low[r] <= slo:
            return r  # round-robin may meet the SLO: any move would only displace a later arrival
        meet = [k for k in range(n) if est[k] <= slo]
        if not meet:
            return r
        return max(meet, key=lambda k: (hits[k], -est[k], -k))
