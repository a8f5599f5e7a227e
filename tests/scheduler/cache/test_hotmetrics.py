"""The lookup path's metrics (scheduler/cache/hotmetrics.py) expose what prometheus_client's own Counter and
Histogram expose for the same observations: names, labels, buckets, cumulative counts and sums."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("prometheus_client", reason="cache metrics need prometheus_client (trtforge[sim])")


def _samples(registry: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in registry.collect():  # type: ignore[attr-defined]
        for s in family.samples:
            if not s.name.endswith("_created"):  # the one thing the plain counts do not keep
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_hot_metrics_match_prometheus_client() -> None:
    from prometheus_client import CollectorRegistry, Counter, Histogram

    from trtforge.scheduler.cache.metrics import CacheMetrics

    ours = CacheMetrics(namespace="trtforge")
    ref = CollectorRegistry()
    bounds = ours.hot.bounds
    access = Counter("trtforge_cache_access", "", ["result", "layer"], registry=ref)
    lookup = Histogram("trtforge_cache_lookup_seconds", "", ["layer"], buckets=bounds, registry=ref)
    rng = random.Random(1604)
    for _ in range(5000):
        layer, result = rng.choice(["l1", "l2", "l3"]), rng.choice(["hit", "miss", "stale", "corrupt"])
        # Values on the bucket bounds too: "le" is inclusive on both sides.
        seconds = rng.choice([rng.choice(bounds), rng.expovariate(2e4), rng.uniform(0, 2.0)])
        if rng.random() < 0.1:
            ours.count("uncacheable", "all")
            access.labels(result="uncacheable", layer="all").inc()
            continue
        ours.timed(layer, seconds, result)
        lookup.labels(layer=layer).observe(seconds)
        access.labels(result=result, layer=layer).inc()
    want = _samples(ref)
    got = {k: v for k, v in _samples(ours.registry).items() if k[0].startswith(("trtforge_cache_access",
                                                                                   "trtforge_cache_lookup"))}
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-12), k
    assert ours.value("trtforge_cache_lookup_seconds_count", layer="l1") == want[
        ("trtforge_cache_lookup_seconds_count", (("layer", "l1"),))]
