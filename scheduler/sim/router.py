"""Routing arrivals to replicas.

- ``round-robin``: arrival i goes to replica i mod n.
- ``prefix-affinity``: the replica whose prefix cache holds the longest prefix of the request that admission can
  reuse (never the block holding the last prompt token, as ``Scheduler._try_admit``), among replicas within 1.25x
  + 8 requests of the least loaded; no cached prefix anywhere -> the least loaded.
- ``cache-aware`` (load-aware affinity after SGLang's cache-aware router, ``sgl-router`` ``CacheAwarePolicy``):
  round-robin, left only while the cluster has spare capacity and only where that turns this request's TTFT from
  a certain miss into a likely hit.

  Spare capacity (round 4), from the router's own observations (``Load``): the prompt tokens arrived per second
  since the first arrival (lambda), against each replica's measured drain rate (mu_k: prompt tokens it worked off
  per second over the intervals between arrivals in which it had prompt tokens to prefill throughout: some at the
  start, the arrival routed then included, and some left at the end; so KV stalls, decode interleaving and
  attention over long contexts are all in it. An interval in which it ran dry is left out: how long it was busy
  then is unknown). Round-robin gives every replica lambda / n; while lambda >= n * min_k mu_k (before any
  replica was measured: n * the step model's best prefill rate, which no replica beats without cache hits) some
  replica receives work faster than it has been seen to clear it, and the router is exactly round-robin. The
  replicas are the same hardware, so their rates differ by the mix of requests each got; taking the slowest errs
  toward round-robin, the baseline. Why: in a sustained overload every replica saturates within a minute and all the
  goodput is made before that (bench/RESULTS.md, issue 13 rounds 3-4); a move there only chooses which requests
  miss, and the outcome is chaotic in a few early moves (-6% from two moves at 2x the traces' rate, -23% from
  five in the first 16 s at 3x). Moves are worth making while there is room to absorb them, not in a pile-up.

  The move (round 3, with the request's own prefill from the step model, round 4). Per replica k:
  - ``low[k]``: a lower bound on the request's TTFT there: the prompt tokens k must prefill first (the rest of its
    prefilling requests, its queue) at the step model's best prefill rate (a full chunk at context 0), plus the
    request's own uncached prompt at the step model's time for it alone (full chunks from its cached prefix on:
    attention over the prefix it has already read makes a 120k-token prompt take ~10 s, not the ~3.6 s the best
    rate says), ignoring any wait for KV blocks;
  - ``est[k]``: the same where k can start the request at once (its queue is empty and its free blocks hold the
    request's admission cost, prompt + cap less the cached prefix), else infinite (it waits for blocks, by how
    long only its running requests' ends tell).
  1. RR's replica r may meet the SLO (``low[r] <= slo``): r;
  2. r certainly misses it (``low[r] > slo``): among the replicas that start it within the SLO, the one with the
     longest cached prefix (then the lowest estimate); none: r. A request whose own prefill exceeds the SLO is a
     miss everywhere and stays with r (moving it would only delay the receiver's next arrivals by its prefill).
  Affinity therefore acts only where round-robin certainly fails the request: following a cached prefix while
  round-robin's replica could still serve the request in time moved goodput by -13% with ONE early move on a
  hand-built 2-replica overload (tests/scheduler/test_router_13.py; bench/RESULTS.md "round 3").
  Why not SGLang's rule (balance whenever the load gap crosses its thresholds, else follow the longest prefix):
  a request moved off round-robin that would have met its SLO anyway only displaces a later arrival at the
  receiving replica; every such variant lost rows to round-robin (bench/RESULTS.md, issue 13, round 3).
  ``pick`` is called once per arrival, in arrival order (it updates ``Load``).

With a response cache in front of the scheduler (``simulate --response-cache``) every arrival is routed (the
replica's L1 is looked up where it lands, so round-robin's turn counts every arrival, as a load balancer in front
of the replicas counts them), but a hit never reaches the scheduler: ``answered_by_cache`` takes it back out of
``Load`` (it is no prompt tokens to prefill: counted, it raised the arrival rate and credited the replica with
draining tokens it never received).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..prefix_cache import block_keys
from ..request import Request
from ..scheduler import Scheduler

ROUTERS = ("round-robin", "prefix-affinity", "cache-aware")


def ahead_tokens(s: Scheduler) -> int:
    """Prompt tokens a replica must prefill before a new arrival: its queue and the rest of its prefilling ones."""
    return s.queued_tokens + sum(q.prompt_len - q.computed for q in s.prefilling.values())


@dataclass
class Load:
    """The cache-aware router's online load signals: prompt tokens arrived since the first arrival, and per
    replica the prompt tokens it worked off and the seconds it did so while backlogged (see the module doc)."""

    n: int
    best_rate: float = 0.0  # prompt tokens/s of one replica at the step model's best prefill rate (0: unknown)
    t0: float | None = None
    arrived: int = 0
    last_t: float = 0.0
    last_ahead: list[int] = field(default_factory=list)
    last_sent: list[int] = field(default_factory=list)  # prompt tokens submitted to each replica at the last arrival
    drained: list[float] = field(default_factory=list)
    backlogged_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.last_sent, self.drained, self.backlogged_s = [0] * self.n, [0.0] * self.n, [0.0] * self.n

    def observe(self, t: float, ahead: list[int]) -> None:
        """At an arrival at ``t`` (before routing it): credit each replica that had prompt tokens to prefill
        from the last arrival (after routing it) until now."""
        if self.t0 is None:
            self.t0 = t
        elif t > self.last_t:
            dt = t - self.last_t
            for k in range(self.n):
                if self.last_ahead[k] + self.last_sent[k] > 0 and ahead[k] > 0:
                    self.drained[k] += self.last_ahead[k] + self.last_sent[k] - ahead[k]
                    self.backlogged_s[k] += dt
        self.last_t, self.last_ahead = t, ahead

    def record(self, k: int, prompt_tokens: int) -> None:
        """The arrival observed last went to replica ``k``."""
        self.arrived += prompt_tokens
        self.last_sent = [0] * self.n
        self.last_sent[k] = prompt_tokens

    def withdraw(self, k: int, prompt_tokens: int) -> None:
        """The arrival recorded last (to replica ``k``) never reached it: a response-cache hit."""
        self.arrived -= prompt_tokens
        self.last_sent[k] -= prompt_tokens

    def overloaded(self, t: float) -> bool:
        """lambda >= n * the slowest measured drain rate (module doc); before any replica was seen backlogged,
        n * the best prefill rate (no replica prefills faster; 0: unknown, never overloaded)."""
        rates = [d / b for d, b in zip(self.drained, self.backlogged_s, strict=True) if b > 0]
        if not rates and self.best_rate > 0:
            rates = [self.best_rate]
        if not rates or self.t0 is None or t <= self.t0:
            return False
        return self.arrived / (t - self.t0) >= self.n * min(rates)


class Router:
    def __init__(self, name: str, scheds: Sequence[Scheduler], prefill_s_per_token: float = 0.0,
                 slo_ttft_s: float = 5.0, prefill_s: Callable[[int, int], float] | None = None) -> None:
        """``prefill_s_per_token``: the step model's best prefill time per token (the simulator passes it; 0 =
        no estimate: then no miss is certain and ``cache-aware`` is round-robin). ``prefill_s(start, end)``: the
        step model's seconds to prefill prompt tokens [start, end) of one request alone (the simulator passes
        it); None: (end - start) x ``prefill_s_per_token``."""
        self.name = name
        self.scheds = list(scheds)
        self.prefill_s_per_token = prefill_s_per_token
        self.slo_ttft_s = slo_ttft_s
        self.prefill_s = prefill_s or (lambda start, end: (end - start) * prefill_s_per_token)
        self.load = Load(len(self.scheds), 1.0 / prefill_s_per_token if prefill_s_per_token > 0 else 0.0)

    def pick(self, req: Request, i: int) -> int:
        n = len(self.scheds)
        if self.name == "round-robin" or n == 1:
            return i % n
        tpb = self.scheds[0].config.tokens_per_block
        if self.name == "cache-aware":
            ahead = [ahead_tokens(s) for s in self.scheds]
            self.load.observe(req.arrival, ahead)
            k = i % n if self.load.overloaded(req.arrival) else self._cache_aware(req, i % n, ahead)
            self.load.record(k, req.prompt_tokens)
            return k
        keys = block_keys(req, tpb)[:(req.prompt_tokens - 1) // tpb]  # admission never uses the last token's block
        matches = [s.cache.match(keys) if keys else ([], 0) for s in self.scheds]
        hits = [len(m[0]) for m in matches]
        loads = [len(s.queue) + len(s.running) for s in self.scheds]
        least = min(range(n), key=lambda k: (loads[k], k))
        bound = loads[least] * 1.25 + 8
        cands = [k for k in range(n) if loads[k] <= bound]
        return max(cands, key=lambda k: (hits[k], -loads[k], -k))

    def answered_by_cache(self, req: Request, k: int) -> None:
        """``req``, just picked for replica ``k``, was answered by the response cache: not load (module doc)."""
        if self.name == "cache-aware" and len(self.scheds) > 1:
            self.load.withdraw(k, req.prompt_tokens)

    def _cache_aware(self, req: Request, r: int, ahead: list[int]) -> int:
        n = len(self.scheds)
        tpb = self.scheds[0].config.tokens_per_block
        keys = block_keys(req, tpb)[:(req.prompt_tokens - 1) // tpb]  # admission never uses the last token's block
        matches = [s.cache.match(keys) if keys else ([], 0) for s in self.scheds]
        need = -(-req.total_tokens // tpb)
        low: list[float] = []
        est: list[float] = []
        for k, s in enumerate(self.scheds):
            hit, idle = len(matches[k][0]), matches[k][1]
            low.append(ahead[k] * self.prefill_s_per_token + self.prefill_s(min(hit * tpb, req.prompt_tokens),
                                                                            req.prompt_tokens))
            # the admission cost of a reserve-to-completion policy that credits cached blocks (Scheduler._try_admit)
            cost = max(need, hit) - hit + idle
            can = not s.queue and s.cache.available - s.outside_blocks >= cost
            est.append(low[-1] if can else float("inf"))
        slo = self.slo_ttft_s
        if low[r] <= slo:
            return r  # round-robin may meet the SLO: any move would only displace a later arrival
        meet = [k for k in range(n) if est[k] <= slo]
        if not meet:
            return r
        return max(meet, key=lambda k: (len(matches[k][0]), -est[k], -k))
