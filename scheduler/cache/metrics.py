"""Prometheus metrics of one response cache (its own ``CollectorRegistry``, like the scheduler's metrics).

The names are issue 16's, unprefixed by default (``namespace="trtforge"`` prefixes them all with ``trtforge_``):
``cache_access_total{result, layer}`` (result: hit, stale, miss, corrupt, wrong_version, error, busy: no pooled
L2 connection free, uncacheable: layer all, or unkeyable for a request ``serve`` passed through unread,
stale_if_error: a stale answer ``serve`` gave its refresher because the refresh failed),
``cache_lookup_seconds{layer}``, ``cache_eviction_total{layer}``, ``cache_write_buffer_depth``, ``cache_flush_seconds``,
``cache_dropped_writes_total{reason}``, ``cache_l2_up``.
"""

from __future__ import annotations

from typing import Any


class CacheMetrics:
    def __init__(self, namespace: str = "") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        from .hotmetrics import HotMetrics

        self.registry = CollectorRegistry()
        r = self.registry
        prefix = f"{namespace}_" if namespace else ""
        # The lookup path's counter and histogram (every lookup touches them): plain counts behind a collector.
        self.hot = HotMetrics(prefix, (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5))
        r.register(self.hot)
        self.eviction = Counter(f"{prefix}cache_eviction", "entries evicted for room", ["layer"], registry=r)
        self.buffer_depth = Gauge(f"{prefix}cache_write_buffer_depth", "L2 writes waiting for the next pipeline",
                                  registry=r)
        self.flush = Histogram(f"{prefix}cache_flush_seconds", "L2 pipeline flush latency",
                               buckets=(1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0), registry=r)
        self.dropped = Counter(f"{prefix}cache_dropped_writes", "L2 writes dropped", ["reason"], registry=r)
        self.l2_up = Gauge(f"{prefix}cache_l2_up", "1 while Redis answers, 0 during an outage", registry=r)

        self.count = self.hot.count
        self.timed = self.hot.timed  # (layer, seconds, result): one lookup of a layer, its latency and its result

    def value(self, name: str, **labels: Any) -> float:
        """A sample's current value (tests, the simulator's summary)."""
        got = self.registry.get_sample_value(name, labels)
        return 0.0 if got is None else float(got)
