"""The tiers against real parts: cachetools L1, a real redis-server for L2 (pipelining, TTL expiry, stale serving,
pub/sub invalidation across two cache clients, an outage), FAISS for L3."""

from __future__ import annotations

import time

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.scheduler.cache.entry import CacheConfig, Entry
from trtforge.scheduler.cache.front import ResponseCache
from trtforge.scheduler.cache.keys import make_key

pytest.importorskip("prometheus_client", reason="cache metrics need prometheus_client (trtforge[sim])")


def req(text: str, **kw: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0, **kw}


def test_l1_ttl_and_lru_eviction() -> None:
    cache = ResponseCache(CacheConfig(l1_entries=2, ttl_qa_s=0.2))
    for i in range(3):
        cache.store(make_key(req(f"q{i}")), f"a{i}")
    assert not cache.lookup(req("q0")).hit  # evicted (LRU, size 2)
    assert cache.lookup(req("q2")).value == "a2"
    assert cache.metrics.value("cache_eviction_total", layer="l1") == 1
    time.sleep(0.25)
    assert not cache.lookup(req("q2")).hit  # past its TTL
    assert cache.metrics.value("cache_access_total", result="hit", layer="l1") == 1


def test_sampled_request_never_cached_and_serve_computes_once() -> None:
    cache = ResponseCache()
    calls: list[str] = []

    def compute(r: dict) -> str:
        calls.append(r["messages"][0]["content"])
        return "answer"

    for _ in range(3):
        assert cache.serve(req("hello"), compute)[0] == "answer"
    assert calls == ["hello"]
    for _ in range(2):
        cache.serve(req("hello", temperature=0.7), compute)
    assert calls == ["hello", "hello", "hello"]


def test_l2_pipelines_buffered_writes(redis_server) -> None:  # type: ignore[no-untyped-def]
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, flush_entries=1000, namespace="t:pipe")
    a = ResponseCache(cfg, engine_sha="e1")
    import redis

    stats = redis.Redis.from_url(redis_server.url)
    before = int(stats.info("stats")["total_connections_received"])
    t0 = time.monotonic()
    for i in range(500):
        a.store(make_key(req(f"q{i}")), i)
    time.sleep(0.3)  # one or a few 100 ms flush ticks
    ticks = (time.monotonic() - t0) / cfg.flush_interval_s
    assert 1 <= a.l2.flushes <= ticks + 1 and len(stats.keys("t:pipe:e:*")) == 500  # at most one per 100 ms
    assert int(stats.info("stats")["total_connections_received"]) - before <= 3  # pooled, not a connection each
    b = ResponseCache(cfg, engine_sha="e1")
    got = b.lookup(req("q7"))
    assert (got.layer, got.value) == ("l2", 7)
    assert b.lookup(req("q7")).layer == "l1"  # promoted
    a.close()
    b.close()


def test_l2_ttl_stale_while_one_refresh_then_expiry(redis_server) -> None:  # type: ignore[no-untyped-def]
    # Fresh for 0.5 s, then stale for 1.5 s more, then gone: the margins (0.3 s into the stale window, 0.4 s past
    # it) are wide enough for a loaded CI machine; every step is timed from the write, not from the previous sleep.
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, ttl_qa_s=0.5, stale_grace_s=1.5,
                      namespace="t:ttl")
    a = ResponseCache(cfg, engine_sha="e1")
    a.store(make_key(req("q")), "v1")
    a.l2.flush()
    written = time.monotonic()
    b = ResponseCache(cfg, engine_sha="e1")
    assert b.lookup(req("q")).layer == "l2"
    time.sleep(max(0.0, written + 0.8 - time.monotonic()))
    b.l1.clear()
    first, second = b.lookup(req("q")), b.lookup(req("q"))
    assert time.monotonic() - written < 1.7, "the machine stalled past the stale window"
    assert first.stale and first.refresh and first.value == "v1"
    assert second.stale and not second.refresh  # exactly one caller refreshes
    time.sleep(max(0.0, written + 2.4 - time.monotonic()))
    assert not b.lookup(req("q")).hit  # gone from Redis after the grace period
    a.close()
    b.close()


def test_pubsub_invalidation_across_two_clients(redis_server) -> None:  # type: ignore[no-untyped-def]
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace="t:inv")
    a, b = ResponseCache(cfg, engine_sha="old"), ResponseCache(cfg, engine_sha="old")
    a.store(make_key(req("q")), "from the old engine")
    a.l2.flush()
    assert b.lookup(req("q")).value == "from the old engine"  # now also in b's L1
    a.set_engine("new-manifest-sha")
    deadline = time.monotonic() + 5
    while b.invalidation.received < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert b.engine_sha == "new-manifest-sha"
    assert not b.lookup(req("q")).hit  # neither b's L1 nor the old L2 key is served
    c = ResponseCache(cfg)  # a replica started later adopts the stored version
    assert c.engine_sha == "new-manifest-sha"
    for x in (a, b, c):
        x.close()


def test_corrupt_entry_is_counted_never_served(redis_server) -> None:  # type: ignore[no-untyped-def]
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace="t:bad")
    a = ResponseCache(cfg, engine_sha="e1")
    key = make_key(req("q"))
    a.store(key, "good")
    a.l2.flush()
    name = a.l2.name(a.version, key.digest)
    raw = a.l2.client.get(name)
    a.l2.client.set(name, raw.replace(b"good", b"evil"))  # bit rot / tampering: checksum no longer matches
    b = ResponseCache(cfg, engine_sha="e1")
    assert not b.lookup(req("q")).hit
    assert b.metrics.value("cache_access_total", result="corrupt", layer="l2") == 1
    a.close()
    b.close()


def test_outage_degrades_to_l1_without_blocking(own_redis, caplog) -> None:  # type: ignore[no-untyped-def]
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=own_redis.url, namespace="t:out")
    cache = ResponseCache(cfg, engine_sha="e1")
    cache.store(make_key(req("kept")), "from L1")
    own_redis.stop()  # the server dies mid-run
    worst = 0.0
    for i in range(50):
        t0 = time.perf_counter()
        assert cache.lookup(req("kept")).value == "from L1"
        assert not cache.lookup(req(f"new{i}")).hit
        cache.store(make_key(req(f"new{i}")), i)
        worst = max(worst, time.perf_counter() - t0)
    cache.l2.flush()
    assert worst < 1.0  # one socket timeout at most, then the tier is marked down
    assert cache.l2.dropped >= 50
    assert cache.metrics.value("cache_l2_up") == 0
    assert any("unreachable" in r.message for r in caplog.records)
    cache.close()


def test_unreachable_redis_at_startup_is_l1_only(caplog) -> None:  # type: ignore[no-untyped-def]
    cfg = CacheConfig(layers=("l1", "l2"), redis_url="redis://127.0.0.1:1/0", namespace="t:none")
    cache = ResponseCache(cfg, engine_sha="e1")
    assert any("redis://127.0.0.1:1/0" in r.getMessage() for r in caplog.records)  # warned at start-up
    assert cache.metrics.value("cache_l2_up") == 0
    cache.store(make_key(req("q")), "v")
    assert cache.lookup(req("q")).value == "v"
    assert not cache.lookup(req("other")).hit  # a miss, not an error
    cache.close()


def test_write_buffer_is_bounded_during_an_outage() -> None:
    cfg = CacheConfig(layers=("l1", "l2"), redis_url="redis://127.0.0.1:1/0", namespace="t:buf", buffer_max=16,
                      flush_entries=10**6, flush_interval_s=60.0)
    cache = ResponseCache(cfg, engine_sha="e1")
    for i in range(200):
        cache.store(make_key(req(f"q{i}")), i)
    assert len(cache.l2._buffer) <= 16
    assert cache.metrics.value("cache_write_buffer_depth") == len(cache.l2._buffer)  # read when scraped
    assert cache.metrics.value("cache_dropped_writes_total", reason="buffer_full") == 200 - 16
    cache.close()


def test_l3_index_and_version_saved_beside_the_cache(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("faiss", reason="L3 needs faiss-cpu")
    cfg = CacheConfig(layers=("l1", "l3"), l3_threshold=0.8)
    a = ResponseCache(cfg, engine_sha="e1")
    a.rebuild_index()  # version 2
    a.store(make_key(req("How many vacation days do new hires get?")), "25")
    a.l3.save(tmp_path)
    b = ResponseCache(cfg, engine_sha="e1")
    b.l3.load(tmp_path)
    assert b.l3.version == 2 and b.version == a.version
    got = b.lookup(req("How many vacation days do new hires get ?"))
    assert (got.layer, got.value) == ("l3", "25")


def test_l3_serves_near_duplicates_within_scope_only() -> None:
    pytest.importorskip("faiss", reason="L3 needs faiss-cpu")
    cache = ResponseCache(CacheConfig(layers=("l1", "l3"), l3_threshold=0.8), engine_sha="e1")
    cache.store(make_key(req("How do I reset my password on the billing portal?", adapter="a")), "steps")
    near = cache.lookup(req("How do I reset my pasword on the billing portal ?", adapter="a"))
    assert (near.layer, near.value) == ("l3", "steps") and 0.8 <= near.similarity < 1.0
    assert not cache.lookup(req("How do I reset my pasword on the billing portal ?", adapter="b")).hit
    assert not cache.lookup(req("Which invoices are overdue this month?", adapter="a")).hit
    cache.rebuild_index()  # a new index version: nothing of the old one is served
    assert not cache.lookup(req("How do I reset my pasword on the billing portal?", adapter="a")).hit


def test_entry_round_trip_and_integrity() -> None:
    e = Entry(digest="d", value={"text": "x"}, created=1.0, expires=2.0, version="v")
    assert Entry.from_bytes(e.to_bytes(), "d") == e
    with pytest.raises(ValueError):
        Entry.from_bytes(e.to_bytes(), "other")
    with pytest.raises(ValueError):
        Entry.from_bytes(b"0000|{}", "d")


def test_index_rebuild_is_published_to_other_replicas(redis_server) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("faiss", reason="L3 needs faiss-cpu")
    cfg = CacheConfig(layers=("l1", "l2", "l3"), redis_url=redis_server.url, namespace="t:idx", l3_threshold=0.8)
    a, b = ResponseCache(cfg, engine_sha="e1"), ResponseCache(cfg, engine_sha="e1")
    b.store(make_key(req("Where do I download last month's invoice?")), "billing page")
    b.l2.flush()
    assert b.lookup(req("Where do I download last months invoice?")).layer == "l3"
    a.rebuild_index()  # e.g. a new embedding: every replica drops the old index version
    deadline = time.monotonic() + 5
    while b.invalidation.received < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert b.l3.version == a.l3.version == 2 and b.version == a.version
    assert len(b.l3) == 0 and not b.lookup(req("Where do I download last month's invoice?")).hit
    a.close()
    b.close()


def test_pluggable_embedding_and_metric_names() -> None:
    pytest.importorskip("faiss", reason="L3 needs faiss-cpu")
    import numpy as np

    dim = 8

    def by_topic(text: str) -> np.ndarray:  # a stand-in sentence encoder: same first word -> same meaning
        vec = np.zeros(dim, dtype=np.float32)
        vec[sum(map(ord, text.split()[0].lower().strip(":,.?"))) % dim] = 1.0
        return vec

    cache = ResponseCache(CacheConfig(layers=("l1", "l3"), l3_dim=dim, l3_threshold=0.99), engine_sha="e1",
                          embed=by_topic)
    cache.store(make_key(req("Refunds: how long do they take?")), "5 days")
    got = cache.lookup(req("refunds for a cancelled order, when?"))  # no shared n-grams to speak of; same topic
    assert (got.layer, got.value) == ("l3", "5 days")
    names = {m.name for m in cache.metrics.registry.collect()}
    assert {"cache_access", "cache_lookup_seconds", "cache_eviction", "cache_write_buffer_depth",
            "cache_flush_seconds"} <= names  # exposed as cache_access_total, cache_eviction_total, ...
    assert cache.metrics.value("cache_access_total", result="hit", layer="l3") == 1
    assert cache.metrics.value("cache_lookup_seconds_count", layer="l3") == 1


def test_replica_catches_up_on_an_invalidation_missed_during_an_outage(own_redis) -> None:  # type: ignore[no-untyped-def]
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=own_redis.url, namespace="t:away")
    a, b = ResponseCache(cfg, engine_sha="old"), ResponseCache(cfg, engine_sha="old")
    own_redis.stop()  # b's subscriber loses its connection and retries every second
    own_redis.restart()  # the server is back (empty) on the same port
    try:
        a.set_engine("new-sha")  # published at once: b's subscriber is most likely still away and misses it
        deadline = time.monotonic() + 8
        while b.engine_sha != "new-sha" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.engine_sha == "new-sha"  # read back from the version key when b resubscribed (or heard live)
    finally:
        a.close()
        b.close()


def test_l1_has_a_byte_bound_beside_its_entry_bound() -> None:
    """L1 had only an entry bound: 10,000 answers of 1 MB each held 10 GB in-process. Now its bytes stay under
    ``l1_max_bytes`` too (least recently used out first, counted as evictions), and one answer larger than all of
    L1 is not kept there while L2/L3 (here: none) would still store it; nor is the older answer under its key."""
    from trtforge.scheduler.cache.l1 import entry_bytes

    cap = 64 * 1024
    cache = ResponseCache(CacheConfig(l1_entries=1000, l1_max_bytes=cap))
    big = "x" * 20_000
    for i in range(10):
        cache.store(make_key(req(f"q{i}")), f"{i}{big}")
    assert cache.l1.bytes <= cap and 2 <= len(cache.l1) <= 3
    assert cache.lookup(req("q9")).hit and not cache.lookup(req("q0")).hit  # the oldest went first
    assert cache.metrics.value("cache_eviction_total", layer="l1") == 10 - len(cache.l1)
    key = make_key(req("huge"))
    cache.store(key, "small")
    assert cache.lookup(req("huge")).value == "small"
    cache.store(key, "y" * (2 * cap))  # a newer answer too big for L1: the old one must not be served
    assert not cache.lookup(req("huge")).hit
    entry = cache.l1.get(make_key(req("q9")).digest)
    assert entry is not None and entry_bytes(entry) > 20_000
    with pytest.raises(InputError, match="l1_max_bytes"):
        CacheConfig(l1_max_bytes=0)
