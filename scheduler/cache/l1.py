"""L1: a bounded in-process LRU with a per-entry TTL (cachetools' TLRUCache), thread-safe.

Two bounds, both hard: ``max_entries`` entries and ``max_bytes`` bytes of entries (``entry_bytes``: what the
entry's value, prompt text and metadata hold, as ``sys.getsizeof`` counts a str or bytes value and the JSON length
counts any other). The least recently used entries go first to make room for either; an entry larger than
``max_bytes`` on its own is not kept in L1 (an older entry under its key goes too, so it is never served in its
place) and the other tiers still store it. Only fresh entries (before their logical expiry) are served from L1;
LRU evictions are counted.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from .entry import Entry, encoded_size


def entry_bytes(entry: Entry) -> int:
    """The bytes ``entry`` holds in L1 (value, prompt text, metadata, and a fixed 200 for the entry itself)."""
    v = entry.value
    value = sys.getsizeof(v) if isinstance(v, str | bytes | bytearray) else encoded_size(v)
    return 200 + value + sys.getsizeof(entry.text) + (encoded_size(entry.meta) if entry.meta else 0)


class L1:
    def __init__(self, max_entries: int, metrics: Any = None, max_bytes: int = 256 * 2**20) -> None:
        from cachetools import TLRUCache

        outer = self

        class _Cache(TLRUCache):  # type: ignore[misc,type-arg]
            def popitem(self) -> Any:  # called only to make room: an eviction
                item = super().popitem()
                if outer.metrics is not None:
                    outer.metrics.eviction.labels(layer="l1").inc()
                return item

        self.metrics = metrics
        self.max_entries = max_entries
        self._lock = threading.Lock()
        # the cache's own size is in bytes; the entry count is bounded in ``put``
        self._cache = _Cache(maxsize=max_bytes, ttu=lambda _k, v, _now: v.expires, timer=time.time,
                             getsizeof=entry_bytes)

    def get(self, digest: str) -> Entry | None:
        # Indexing, not ``get``: TLRUCache.get checks membership (and the clock) before it indexes; a miss raises.
        with self._lock:
            try:
                return self._cache[digest]  # type: ignore[no-any-return]
            except KeyError:
                return None

    def put(self, entry: Entry) -> None:
        with self._lock:
            cache = self._cache
            if entry_bytes(entry) > cache.maxsize:  # larger than the whole L1: not kept, nor an older answer
                cache.pop(entry.digest, None)
                return
            if entry.digest not in cache:
                cache.expire()  # entries past their TTL go first, not live ones
                while len(cache) >= self.max_entries:
                    cache.popitem()
            cache[entry.digest] = entry

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()

    @property
    def bytes(self) -> int:
        """The bytes the entries hold now (``entry_bytes`` summed), at most ``max_bytes``."""
        with self._lock:
            return int(self._cache.currsize)

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)
