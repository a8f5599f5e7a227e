"""``simulate --response-cache l1|l1,l2|l1,l2,l3``: the response cache as a filter in front of the scheduler.

The simulator calls ``CacheFront.serve(request, replica, now)`` after routing and before submitting: a hit returns
the tier's *measured* lookup time (``cache_costs.measure``: the real cachetools L1, the redis-server at
``--redis-url``, a FAISS index) and the request is answered at ``now`` + that time, never reaching the scheduler;
a miss returns None and pays the measured all-tiers-miss time before its first token (the simulator submits it
to the scheduler that much after its arrival; ``miss_seconds``). ``done`` records an answer
when the scheduler finishes it: from then on, for the TTL, the same key is a hit.

Where answers live (as ``scheduler/cache`` keeps them): L1 is in-process, one LRU of ``l1_entries`` per replica
(the replica that computed or last served the answer); L2 (Redis) is shared by every replica; L3 is in-process too
and, in a trace, can only match what L2 already holds (below). Lookup order L1 -> L2 -> L3.

What a trace can tell: Mooncake-style traces identify a prompt only by its block hashes (``hash_ids``, one per
512-token block, each covering the block and everything before it) and its length. Equal hashes and length are the
same prompt, so exact repeats (L1/L2 hits) are replayed faithfully, under the issue's rule that a request is cached
when reproducible (the simulator treats every trace request as greedy). Hashes say nothing about *meaning*: two
prompts that differ in one block are different blocks of unknown content, paraphrase or not, so the replay never
credits a semantic (L3) hit; L3 costs its measured lookup time on every miss. The summary reports, as an upper
bound the trace cannot confirm, how many misses differ from an answered prompt of the same adapter only in their
last block (the new user turn): the most a semantic tier could add if every such turn were a paraphrase. A trace
without hashes (Azure's CSV) has no prompt identity: every request misses.

Goodput is the simulator summary's ``goodput_req_s`` when it has one (its SLO flags and window); otherwise the
front's: requests/s meeting both SLOs (TTFT <= ``ttft_slo_s``, TPOT <= ``tpot_slo_s``) over the trace's arrival
span, the same window for the cached and the uncached run. A cached answer arrives whole (TPOT 0).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtforge.build_engine.core.errors import InputError

from ..request import Request
from .cache_costs import TierCosts

TIER_SETS = ("l1", "l1,l2", "l1,l2,l3")
TTFT_SLO_S = 2.0
TPOT_SLO_S = 0.1


def parse_tiers(text: str) -> tuple[str, ...]:
    norm = ",".join(t.strip().lower() for t in text.split(","))
    if norm not in TIER_SETS:
        raise InputError(f"--response-cache {text!r}: use one of {', '.join(TIER_SETS)}")
    return tuple(norm.split(","))


def request_key(req: Request) -> tuple[Any, ...] | None:
    """A trace request's exact identity, or None without hashes: adapter, block hashes and prompt length, and what
    ``scheduler/cache/keys.py`` keys besides the prompt that a trace carries: the client's cap (``max_tokens``) and
    the ``cache_salt`` (two caps of one prompt shared an answer here, where the real cache misses)."""
    if not req.block_hashes:
        return None
    return (req.adapter, req.block_hashes, req.prompt_tokens, req.max_new_tokens, req.cache_salt)


@dataclass
class _Span:
    available: float  # when the answer existed (the computing request finished)
    expires: float


def _fresh(span: _Span | None, now: float) -> bool:
    return span is not None and span.available <= now < span.expires


@dataclass
class CacheFront:
    """The filter in front of the simulator's submission (``tiers=()``: records timings only, serves nothing)."""

    tiers: tuple[str, ...]
    costs: TierCosts
    ttl_s: float = 120.0
    l1_entries: int = 10_000
    ttft_slo_s: float = TTFT_SLO_S
    tpot_slo_s: float = TPOT_SLO_S
    hits: dict[str, int] = field(default_factory=lambda: {"l1": 0, "l2": 0, "l3": 0})
    lookups: int = 0
    no_identity: int = 0
    near_duplicates: int = 0  # misses that differ from an answered prompt only in their last block (upper bound)
    _l1: dict[int, OrderedDict[tuple[Any, ...], _Span]] = field(default_factory=dict)
    _l2: dict[tuple[Any, ...], _Span] = field(default_factory=dict)
    _l3: dict[int, dict[tuple[Any, ...], _Span]] = field(default_factory=dict)
    _prefixes: dict[tuple[Any, ...], _Span] = field(default_factory=dict)
    _pending: dict[str, tuple[tuple[Any, ...] | None, int]] = field(default_factory=dict)
    _arrival: dict[str, float] = field(default_factory=dict)
    _first: dict[str, float] = field(default_factory=dict)
    _done: dict[str, float] = field(default_factory=dict)
    _tokens: dict[str, int] = field(default_factory=dict)
    _overhead: dict[str, float] = field(default_factory=dict)

    # --- the simulator's hooks ----------------------------------------------------------------------------------
    def serve(self, req: Request, replica: int, now: float) -> float | None:
        """Seconds until a cached answer is delivered, or None: the request goes on to the scheduler."""
        self._arrival[req.id] = now
        self._tokens[req.id] = req.max_new_tokens
        key = request_key(req)
        self._pending[req.id] = (key, replica)
        if not self.tiers:
            return None
        self.lookups += 1
        if key is None:
            self.no_identity += 1
            self._overhead[req.id] = self.costs.miss
            return None
        layer = self._find(key, replica, now)
        if layer is None:
            self._overhead[req.id] = self.costs.miss
            if len(key[1]) > 1 and _fresh(self._prefixes.get((req.adapter, req.block_hashes[:-1])), now):
                self.near_duplicates += 1
            return None
        self.hits[layer] += 1
        latency = self.costs.hit[layer]
        self._first[req.id] = self._done[req.id] = now + latency
        del self._pending[req.id]
        return latency

    def miss_seconds(self, rid: str) -> float:
        """The lookup time ``rid`` paid before it went on to the scheduler (0 without tiers)."""
        return self._overhead.get(rid, 0.0)

    def first_token(self, rid: str, now: float) -> None:
        self._first.setdefault(rid, now)

    def done(self, rid: str, now: float) -> None:
        self._done[rid] = now
        key, replica = self._pending.pop(rid, (None, 0))
        if key is None or not self.tiers:
            return
        self._remember(key, replica, now)

    # --- the tiers ----------------------------------------------------------------------------------------------
    def _l1_of(self, replica: int) -> OrderedDict[tuple[Any, ...], _Span]:
        return self._l1.setdefault(replica, OrderedDict())

    def _l1_put(self, replica: int, key: tuple[Any, ...], span: _Span) -> None:
        lru = self._l1_of(replica)
        lru[key] = span
        lru.move_to_end(key)
        while len(lru) > self.l1_entries:
            lru.popitem(last=False)

    def _find(self, key: tuple[Any, ...], replica: int, now: float) -> str | None:
        lru = self._l1_of(replica)
        if _fresh(lru.get(key), now):
            lru.move_to_end(key)
            return "l1"
        for layer, span in (("l2", self._l2.get(key)), ("l3", self._l3.get(replica, {}).get(key))):
            if layer in self.tiers and _fresh(span, now):
                assert span is not None
                self._l1_put(replica, key, span)  # an L2/L3 hit is copied into this replica's L1
                return layer
        return None

    def _remember(self, key: tuple[Any, ...], replica: int, now: float) -> None:
        def merged(old: _Span | None) -> _Span:
            if old is not None and old.expires >= now:  # still valid: the new answer only extends it
                return _Span(min(old.available, now), max(old.expires, now + self.ttl_s))
            return _Span(now, now + self.ttl_s)

        self._l1_put(replica, key, merged(self._l1_of(replica).get(key)))
        if "l2" in self.tiers:
            self._l2[key] = merged(self._l2.get(key))
        if "l3" in self.tiers:
            local = self._l3.setdefault(replica, {})
            local[key] = merged(local.get(key))
        adapter, hashes = key[0], key[1]
        if len(hashes) > 1:
            self._prefixes[(adapter, hashes[:-1])] = merged(self._prefixes.get((adapter, hashes[:-1])))

    # --- results ------------------------------------------------------------------------------------------------
    def goodput(self, window_s: float) -> tuple[float, int]:
        """(requests/s meeting both SLOs over ``window_s``, how many met them)."""
        good = 0
        for rid, t_arr in self._arrival.items():
            first, done = self._first.get(rid), self._done.get(rid)
            if first is None or done is None:
                continue  # unserved: an SLO miss
            ttft = first - t_arr  # a miss's lookup time is in ``first``: the simulator submits it after the lookup
            n = self._tokens[rid]
            tpot = (done - first) / (n - 1) if n > 1 else 0.0
            if ttft <= self.ttft_slo_s and tpot <= self.tpot_slo_s:
                good += 1
        return good / max(window_s, 1e-9), good


def _goodput(result: Any, front: CacheFront, window: float) -> tuple[float, int | None]:
    """The simulator's own goodput when its summary has one (``goodput_req_s``: its SLOs, its window, true output
    lengths under a cap), else the front's (module docstring); the front's count of requests within the SLO."""
    own = getattr(getattr(result, "summary", None), "goodput_req_s", None)
    rate, met = front.goodput(window)
    return (float(own), None) if own is not None else (rate, met)


def arrival_window(reqs: Sequence[Request]) -> float:
    times = [r.arrival for r in reqs]
    return max(times) - min(times) if times else 0.0


def replay(reqs: Sequence[Request], run: Callable[[CacheFront | None], Any], tiers: tuple[str, ...],
           costs: TierCosts, *, ttl_s: float = 120.0, l1_entries: int = 10_000) -> tuple[Any, dict[str, Any]]:
    """Run the trace without and with the cache (``run(front)`` is one ``simulate`` call); returns the uncached
    run's result and the cache's summary (hit rates per tier, goodput with and without, measured costs)."""
    window = arrival_window(reqs)
    base = CacheFront((), costs, ttl_s=ttl_s, l1_entries=l1_entries)
    uncached = run(base)
    front = CacheFront(tiers, costs, ttl_s=ttl_s, l1_entries=l1_entries)
    cached = run(front)
    g0, n0 = _goodput(uncached, base, window)
    g1, n1 = _goodput(cached, front, window)
    n = max(front.lookups, 1)
    summary = {
        "tiers": ",".join(tiers), "requests": len(reqs), "lookups": front.lookups,
        "hits": dict(front.hits), "hit_rate": {k: v / n for k, v in front.hits.items()},
        "hit_rate_total": sum(front.hits.values()) / n,
        "requests_without_prompt_identity": front.no_identity,
        "l3_near_duplicate_upper_bound": front.near_duplicates,
        "goodput_req_s_without_cache": g0, "goodput_req_s_with_cache": g1,
        "goodput_ratio": g1 / g0 if g0 > 0 else None,  # None: nothing met the SLO without the cache
        "slo_met_without_cache": n0, "slo_met_with_cache": n1,
        "goodput_from": "simulator summary (its SLO flags and window)" if n1 is None else "response-cache front",
        "slo": {"ttft_s": front.ttft_slo_s, "tpot_s": front.tpot_slo_s, "window_s": window} if n1 is not None else None,
        "ttl_s": ttl_s, "measured_lookup": costs.to_json(),
        "with_cache": {k: cached.summary.to_json()[k] for k in ("completed", "ttft_p50_s", "ttft_p99_s")},
    }
    return uncached, summary
