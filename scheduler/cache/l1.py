"""L1: a bounded in-process LRU with a per-entry TTL (cachetools' TLRUCache), thread-safe.

Only fresh entries (before their logical expiry) are served from L1; LRU evictions are counted.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .entry import Entry


class L1:
    def __init__(self, max_entries: int, metrics: Any = None) -> None:
        from cachetools import TLRUCache

        outer = self

        class _Cache(TLRUCache):  # type: ignore[misc,type-arg]
            def popitem(self) -> Any:  # called only to make room: an eviction
                item = super().popitem()
                if outer.metrics is not None:
                    outer.metrics.eviction.labels(layer="l1").inc()
                return item

        self.metrics = metrics
        self._lock = threading.Lock()
        self._cache = _Cache(maxsize=max_entries, ttu=lambda _k, v, _now: v.expires, timer=time.time)

    def get(self, digest: str) -> Entry | None:
        # Indexing, not ``get``: TLRUCache.get checks membership (and the clock) before it indexes; a miss raises.
        with self._lock:
            try:
                return self._cache[digest]  # type: ignore[no-any-return]
            except KeyError:
                return None

    def put(self, entry: Entry) -> None:
        with self._lock:
            self._cache[entry.digest] = entry

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)
