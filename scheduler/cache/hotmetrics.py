"""The lookup path's two metrics, counted in plain Python and exposed through a prometheus_client collector.

``cache_access_total{result, layer}`` and ``cache_lookup_seconds{layer}`` are touched on every lookup. Through
prometheus_client's ``Counter`` and ``Histogram`` that took ~3 us of an L1 hit (~10 % of it): three lock
acquisitions, an observability check per call and a Python loop over the buckets. Here one lock guards plain
integer counts (the bucket found by bisection) and the families are built when the registry is collected
(a scrape, ``get_sample_value``), with the same names, labels, buckets and cumulative counts as before; what a
scrape no longer shows is the per-series ``_created`` timestamp.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from typing import Any


class HotMetrics:
    def __init__(self, prefix: str, buckets: Sequence[float]) -> None:
        self.prefix = prefix
        self.bounds = tuple(sorted(buckets))
        self._lock = threading.Lock()
        self._access: dict[tuple[str, str], int] = {}
        self._counts: dict[str, list[int]] = {}  # per layer: one count per bucket, then the +Inf overflow
        self._sums: dict[str, float] = {}

    def count(self, result: str, layer: str) -> None:
        with self._lock:
            self._access[(result, layer)] = self._access.get((result, layer), 0) + 1

    def timed(self, layer: str, seconds: float, result: str) -> None:
        i = bisect.bisect_left(self.bounds, seconds)  # the first bucket with seconds <= its bound (Prometheus' le)
        with self._lock:
            counts = self._counts.get(layer)
            if counts is None:
                counts = self._counts[layer] = [0] * (len(self.bounds) + 1)
                self._sums[layer] = 0.0
            counts[i] += 1
            self._sums[layer] += seconds
            self._access[(result, layer)] = self._access.get((result, layer), 0) + 1

    def _families(self) -> tuple[Any, Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        return (CounterMetricFamily(f"{self.prefix}cache_access", "response-cache lookups by layer and result",
                                    labels=["result", "layer"]),
                HistogramMetricFamily(f"{self.prefix}cache_lookup_seconds", "lookup latency per layer",
                                      labels=["layer"]))

    def describe(self) -> Iterator[Any]:  # the names, so the registry refuses a clash as for its own metrics
        yield from self._families()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.utils import floatToGoString

        with self._lock:
            access = dict(self._access)
            counts = {layer: list(c) for layer, c in self._counts.items()}
            sums = dict(self._sums)
        total, lookup = self._families()
        for (result, layer), n in sorted(access.items()):
            total.add_metric([result, layer], n)
        for layer in sorted(counts):
            running, buckets = 0, []
            for bound, n in zip([*self.bounds, float("inf")], counts[layer], strict=True):
                running += n
                buckets.append((floatToGoString(bound), running))
            lookup.add_metric([layer], buckets, sums[layer])
        yield total
        yield lookup
