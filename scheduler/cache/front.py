"""``ResponseCache``: the tiers in front of the scheduler. A hit never reaches the scheduler.

Lookup order L1 -> L2 -> L3 (as configured). A request that is not reproducible (sampled, no seed) is neither looked
up nor stored unless ``cache_sampled``. An L2 or L3 hit is copied into L1. A stale L2 entry (past its logical
expiry, inside the grace period) is served, and exactly one caller (``Lookup.refresh``) is told to recompute it.
A corrupt entry is counted and ignored, never served. Use ``serve(request, compute)`` on the request path:
``compute`` runs (submits to the scheduler) only on a miss or for the one refreshing caller. ``serve`` never fails a
request the cache cannot key: one the key contract cannot read (``lookup`` raises InputError) goes to ``compute``
uncached, and the scheduler answers or refuses it.

Every tier judges freshness by the lookup's ``now`` (default: this process's clock): an answer past its TTL is never
served fresh, one past TTL + ``stale_grace_s`` never at all. (L2's key lives that long by the *writer's* clock: a
reader whose clock runs ahead, or a ``now`` passed in, was served such answers as stale; L1 served them fresh
whatever ``now`` said.) An L2 entry created more than ``CLOCK_SKEW_S`` ahead of the reader's clock is stale, not
fresh: a writer's clock running ahead by hours made its answers fresh (and copied into L1) for those hours.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from trtforge.build_engine.core.errors import InputError

from .entry import CacheConfig, Entry
from .keys import CacheKey, make_key
from .l1 import L1

log = logging.getLogger(__name__)
UNKEYED = CacheKey("", "", "", None, False)  # the key of a request the key contract cannot read (``serve``)
# An L2 entry created further than this ahead of the reader's clock was written by a replica whose clock runs ahead:
# it is served as stale (one caller rewrites it under its own clock), never fresh (nor copied into L1) for the
# writer's TTL plus the skew.
CLOCK_SKEW_S = 1.0


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__ (1.9 us against 0.4 us),
# a fifth of an L1 hit; a Lookup is made per call and owned by its caller, so nothing shares it.
@dataclass(slots=True)
class Lookup:
    key: CacheKey
    value: Any = None
    layer: str | None = None  # l1 | l2 | l3, None on a miss
    stale: bool = False
    refresh: bool = False  # this caller should recompute the (stale) answer
    similarity: float = 1.0
    version: str = ""  # the cache version the lookup ran under: an answer computed after it is stored under it

    @property
    def hit(self) -> bool:
        return self.layer is not None


class ResponseCache:
    def __init__(self, cfg: CacheConfig | None = None, *, engine_sha: str = "none", embed: Any = None,
                 metrics: bool = True) -> None:
        from .metrics import CacheMetrics

        self.cfg = cfg or CacheConfig()
        self.metrics = CacheMetrics() if metrics else None
        self.engine_sha = engine_sha
        self.l1 = L1(self.cfg.l1_entries, self.metrics, self.cfg.l1_max_bytes)
        self.l2 = None
        self.l3 = None
        self.invalidation = None
        if "l3" in self.cfg.layers:
            from .l3 import L3

            self.l3 = L3(self.cfg, embed, self.metrics)
        if "l2" in self.cfg.layers:
            from .l2 import L2
            from .pubsub import Invalidation

            self.l2 = L2(self.cfg, self.metrics)
            self.invalidation = Invalidation(self.l2.client, self.cfg.namespace, self.apply_invalidation,
                                             adopt=engine_sha == "none")
            stored = self.invalidation.last  # read once, before its subscriber started
            if stored is not None and engine_sha == "none":
                self.apply_invalidation(*stored)

    @property
    def version(self) -> str:
        index = self.l3.version if self.l3 is not None else 1
        return f"{self.engine_sha[:16]}.{index}"

    # --- invalidation -------------------------------------------------------------------------------------------
    def apply_invalidation(self, engine_sha: str, index_version: int) -> None:
        self.engine_sha = engine_sha
        if self.l3 is not None:
            self.l3.version = index_version
            self.l3.prune(self.version)
        self.l1.clear()

    def set_engine(self, manifest_sha256: str) -> None:
        """A new engine is deployed: entries answered by the old one are never served again (here and elsewhere)."""
        self.apply_invalidation(manifest_sha256, self.l3.version if self.l3 is not None else 1)
        self._publish()

    def rebuild_index(self) -> None:
        if self.l3 is not None:
            self.apply_invalidation(self.engine_sha, self.l3.rebuild())
            self._publish()

    def _publish(self) -> None:
        if self.invalidation is not None:
            self.invalidation.publish(self.engine_sha, self.l3.version if self.l3 is not None else 1)

    # --- lookup and store ---------------------------------------------------------------------------------------
    def _timed(self, layer: str, t0: float, result: str) -> None:
        if self.metrics is not None:
            self.metrics.timed(layer, time.perf_counter() - t0, result)

    def lookup(self, request: Any, now: float | None = None) -> Lookup:
        """Raises InputError for a malformed request (the key contract names the field)."""
        key = make_key(request, cache_sampled=self.cfg.cache_sampled)
        if not key.cacheable:
            if self.metrics is not None:
                self.metrics.count("uncacheable", "all")
            return Lookup(key)
        now = time.time() if now is None else now
        version = self.version
        t0 = time.perf_counter()
        entry = self.l1.get(key.digest)
        if entry is not None and entry.version == version and now < entry.expires:  # L1's own clock is time.time()
            self._timed("l1", t0, "hit")
            return Lookup(key, entry.value, "l1", version=version)
        self._timed("l1", t0, "miss")
        if self.l2 is not None:
            got = self._lookup_l2(key, version, now)
            if got is not None:
                got.version = version
                return got
        if self.l3 is not None:
            t0 = time.perf_counter()
            found = self.l3.search(key.scope, key.text, version, now)
            self._timed("l3", t0, "hit" if found else "miss")
            if found is not None:
                entry, sim = found
                self.l1.put(replace(entry, digest=key.digest))
                return Lookup(key, entry.value, "l3", similarity=sim, version=version)
        return Lookup(key, version=version)

    def _lookup_l2(self, key: CacheKey, version: str, now: float) -> Lookup | None:
        assert self.l2 is not None
        t0 = time.perf_counter()
        raw, outcome = self.l2.get(version, key.digest)
        if raw is None:
            self._timed("l2", t0, {"down": "error", "busy": "busy", "corrupt": "corrupt"}.get(outcome, "miss"))
            return None
        try:
            entry = Entry.from_bytes(raw, key.digest)
        except (ValueError, KeyError, TypeError):
            self._timed("l2", t0, "corrupt")
            return None
        if entry.version != version:
            self._timed("l2", t0, "wrong_version")
            return None
        if now >= entry.expires + self.cfg.stale_grace_s:  # past the grace by this caller's clock (Redis' PX ran
            self._timed("l2", t0, "miss")  # from the writer's): never served, however long Redis still keeps it
            return None
        if entry.fresh(now) and entry.created <= now + CLOCK_SKEW_S:
            self._timed("l2", t0, "hit")
            self.l1.put(entry)
            return Lookup(key, entry.value, "l2")
        self._timed("l2", t0, "stale")
        # The claim lasts no longer than the refreshed answer stays fresh: with a TTL under 30 s a claim outlived the
        # refresh it covered, and the next time the entry went stale no caller was told to refresh it.
        hold = min(30.0, self.cfg.ttl(key.task))
        return Lookup(key, entry.value, "l2", stale=True,
                      refresh=self.l2.claim_refresh(version, key.digest, hold_s=hold))

    def store(self, key: CacheKey, value: Any, now: float | None = None, version: str | None = None) -> Entry | None:
        """Cache ``value`` as the answer of ``key`` (ignored when the key is not cacheable). ``version``: the cache
        version the answer was computed under (``Lookup.version``). When an invalidation (a new engine) arrived while
        it was computed, the answer is the old engine's: it is not stored at all, so no tier serves it under the new
        version. Without ``version`` the current one is assumed (the caller vouches the answer is current)."""
        if not key.cacheable:
            return None
        current = self.version  # read once: an invalidation landing between a check and the entry (another thread)
        if version is not None and version != current:  # stored the old engine's answer under the new version
            return None
        now = time.time() if now is None else now
        entry = Entry(digest=key.digest, value=value, created=now, expires=now + self.cfg.ttl(key.task),
                      version=current, scope=key.scope, text=key.text)
        self.l1.put(entry)
        if self.l2 is not None:
            self.l2.put(entry.version, entry, now)
        if self.l3 is not None:
            self.l3.add(entry)
        return entry

    def serve(self, request: Any, compute: Callable[[Any], Any]) -> tuple[Any, Lookup]:
        """The request path: answer from the cache, or ``compute(request)`` (the scheduler) and remember it. A request
        the key contract cannot read (a list ``prompt``, a message without a role...) is not the cache's to refuse:
        it is computed, not stored, and counted ``uncacheable`` with layer ``unkeyable``."""
        try:
            got = self.lookup(request)
        except InputError:
            if self.metrics is not None:
                self.metrics.count("uncacheable", "unkeyable")
            return compute(request), Lookup(UNKEYED)
        if got.hit and not got.refresh:
            return got.value, got
        try:
            value = compute(request)
        except Exception as exc:
            if not got.hit:
                raise
            # The refresher of a stale answer: the other callers of this stale period get that answer; a compute
            # that fails gives it to this one too (stale-if-error, RFC 5861), and the next lookup refreshes again.
            log.warning("response cache: refreshing a stale answer failed (%s); served the stale answer",
                        type(exc).__name__)
            if self.metrics is not None:
                self.metrics.count("stale_if_error", got.layer or "l2")
            return got.value, got
        self.store(got.key, value, version=got.version)
        return value, got

    def close(self) -> None:
        if self.invalidation is not None:
            self.invalidation.close()
        if self.l2 is not None:
            self.l2.close()
