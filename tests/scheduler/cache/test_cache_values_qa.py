"""Response-cache values (held-out QA): a binary answer round-trips through Redis and l3.json as the same bytes; an
answer JSON cannot hold exactly is never served changed by another replica (NaN/-inf logprobs came back as null, int
keys as strings, tuples as lists) and never fails the request (bytes inside, sets, 65-bit integers raised TypeError
out of ``serve`` after the answer was computed): the L2 write is dropped and counted, L1 still serves it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from trtforge.scheduler.cache.entry import CacheConfig
from trtforge.scheduler.cache.front import ResponseCache

pytest.importorskip("prometheus_client", reason="cache metrics need prometheus_client (trtforge[sim])")

INEXACT: list[object] = [{"logprobs": [-0.25, float("-inf")]}, float("nan"), {1: "a"}, (1, 2), 1 << 70,
                         {"parts": [b"\x00\xff"]}, {"ids": {1, 2}}]


def _req(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0}


def test_binary_and_inexact_values_between_replicas(redis_server) -> None:  # type: ignore[no-untyped-def]
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace=f"t:val{time.time_ns()}")
    a, b = ResponseCache(cfg, engine_sha="e"), ResponseCache(cfg, engine_sha="e")
    try:
        binary = bytes(range(256)) * 64 + b"\r\n|"
        for value in (binary, bytearray(b"\x00\x01")):
            assert a.serve(_req(f"bin{len(value)}"), lambda _r, v=value: v)[0] == value
        for i, value in enumerate(INEXACT):
            got, _ = a.serve(_req(f"q{i}"), lambda _r, v=value: v)  # computed, answered, not raised
            assert got is value
        assert a.l2 is not None
        a.l2.flush()
        for value in (binary, b"\x00\x01"):
            hit = b.lookup(_req(f"bin{len(value)}"))
            assert (hit.layer, hit.value) == ("l2", value) and type(hit.value) is bytes
        for i, value in enumerate(INEXACT):
            assert not b.lookup(_req(f"q{i}")).hit, value  # never a changed value
            assert a.lookup(_req(f"q{i}")).value is value  # this replica's L1 has the exact one
        assert a.metrics is not None
        assert a.metrics.value("cache_dropped_writes_total", reason="unencodable") == len(INEXACT)
    finally:
        a.close()
        b.close()


def test_l3_save_keeps_binary_values_and_skips_inexact_ones(tmp_path: Path) -> None:
    pytest.importorskip("faiss", reason="L3 needs faiss-cpu")
    cfg = CacheConfig(layers=("l1", "l3"))
    a = ResponseCache(cfg, engine_sha="e")
    a.serve(_req("a binary answer please"), lambda _r: b"\x89PNG\r\n")
    a.serve(_req("a nan answer please"), lambda _r: float("nan"))
    a.l3.save(tmp_path)  # type: ignore[union-attr]
    b = ResponseCache(cfg, engine_sha="e")
    b.l3.load(tmp_path)  # type: ignore[union-attr]
    assert b.lookup(_req("a binary answer please!")).value == b"\x89PNG\r\n"
    assert len(b.l3) == 1 and not b.lookup(_req("a nan answer please!")).hit  # type: ignore[arg-type]
    assert math.isnan(a.lookup(_req("a nan answer please")).value)  # the replica that computed it still has it


def test_busy_pool_is_not_an_outage(redis_server, caplog) -> None:  # type: ignore[no-untyped-def]
    """Every pooled connection in use (many threads, big values) made a lookup raise redis-py's "No connection
    available."; L2 took that for an outage: marked down for a second (most lookups then missed, writes dropped) and
    warned that a healthy Redis was unreachable. Now: a busy miss, writes kept for the next flush, no warning."""
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace=f"t:busy{time.time_ns()}",
                      flush_interval_s=60.0, flush_entries=10**6)  # only the test flushes
    a, b = ResponseCache(cfg, engine_sha="e"), ResponseCache(cfg, engine_sha="e")
    assert a.l2 is not None and a.metrics is not None
    a.serve(_req("stored before"), lambda _r: "kept")
    a.l2.flush()
    held = []
    try:
        import redis

        while True:  # take every connection of a's pool (one is its pub/sub subscriber's)
            try:
                held.append(a.l2.pool.get_connection())
            except redis.ConnectionError:
                break
        a.l1.clear()
        got = a.lookup(_req("stored before"))
        assert not got.hit and a.l2.up and a.metrics.value("cache_l2_up") == 1
        assert a.metrics.value("cache_access_total", result="busy", layer="l2") == 1
        a.serve(_req("written while busy"), lambda _r: "later")
        assert a.l2.flush() == 0 and len(a.l2._buffer) == 1 and a.l2.dropped == 0  # kept, not dropped
    finally:
        for conn in held:
            a.l2.pool.release(conn)
    try:
        assert a.l2.flush() == 1
        assert b.lookup(_req("written while busy")).value == "later"
        assert a.lookup(_req("stored before")).value == "kept"
        assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
    finally:
        a.close()
        b.close()


def test_refreshed_entry_that_goes_stale_again_is_refreshed_again(redis_server) -> None:  # type: ignore[no-untyped-def]
    """The refresh claim was held 30 s whatever the TTL: with a TTL under 30 s, once a refreshed answer went stale
    again no caller was told to refresh it (stale answers until the grace ran out, then misses)."""
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace=f"t:again{time.time_ns()}",
                      ttl_qa_s=1.0, stale_grace_s=30.0)
    a, b = ResponseCache(cfg, engine_sha="e"), ResponseCache(cfg, engine_sha="e")
    assert a.l2 is not None and b.l2 is not None
    try:
        a.serve(_req("q"), lambda _r: "v1")
        a.l2.flush()
        for n in (2, 3):
            time.sleep(1.2)  # past the logical expiry (and the last claim), well inside the grace
            b.l1.clear()
            first, second = b.lookup(_req("q")), b.lookup(_req("q"))
            assert first.stale and first.refresh and not second.refresh, n  # one refresher per stale period
            b.store(first.key, f"v{n}", version=first.version)
            b.l2.flush()
    finally:
        a.close()
        b.close()


def test_replica_started_during_an_outage_adopts_the_stored_version(own_redis) -> None:  # type: ignore[no-untyped-def]
    """A replica without its own version (engine_sha "none") adopts the stored one at start-up; started while Redis
    did not answer, it kept "none" for good once Redis was back, and read the entries of that version."""
    import os
    import signal

    cfg = CacheConfig(layers=("l1", "l2"), redis_url=own_redis.url, namespace="t:adopt")
    a = ResponseCache(cfg, engine_sha="old")
    a.set_engine("new-manifest")  # the deployed version, stored in Redis
    os.kill(own_redis.proc.pid, signal.SIGSTOP)  # Redis stops answering (a partition: its data stays)
    try:
        c = ResponseCache(cfg)
        assert c.engine_sha == "none"
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    try:
        deadline = time.monotonic() + 8
        while c.engine_sha != "new-manifest" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.engine_sha == "new-manifest" and c.version == a.version
    finally:
        a.close()
        c.close()


def test_a_refused_command_is_not_an_outage(own_redis, caplog) -> None:  # type: ignore[no-untyped-def]
    """A key of another type under an entry's name (WRONGTYPE) or a claim refused at maxmemory (OOM) raised a
    ResponseError that L2 took for an outage: the tier went down, warned "unreachable", and good lookups missed."""
    from trtforge.scheduler.cache.keys import make_key

    cfg = CacheConfig(layers=("l1", "l2"), redis_url=own_redis.url, namespace="t:refused", ttl_qa_s=0.2,
                      stale_grace_s=30.0)
    a, b = ResponseCache(cfg, engine_sha="e"), ResponseCache(cfg, engine_sha="e")
    assert a.l2 is not None and b.l2 is not None and b.metrics is not None
    try:
        a.serve(_req("good"), lambda _r: "G")
        a.l2.flush()
        a.l2.client.rpush(a.l2.name(a.version, make_key(_req("odd")).digest), b"someone else's list")
        assert not b.lookup(_req("odd")).hit
        assert b.metrics.value("cache_access_total", result="corrupt", layer="l2") == 1
        assert b.l2.up and b.lookup(_req("good")).value == "G"
        time.sleep(0.3)  # "good" is stale now; its refresh claim is a SET NX, refused at maxmemory
        a.l2.client.config_set("maxmemory-policy", "noeviction")
        a.l2.client.config_set("maxmemory", "1")
        b.l1.clear()
        got = b.lookup(_req("good"))
        assert got.stale and not got.refresh and b.l2.up  # served stale; the tier stays up
        assert b.lookup(_req("good")).value == "G"
        assert b.metrics.value("cache_l2_up") == 1
        assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert any("refused a command" in r.getMessage() for r in caplog.records)
    finally:
        a.close()
        b.close()


def test_invalidation_between_the_version_check_and_the_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """``store`` read the version twice: a deploy applied by the subscriber thread in between stored the old
    engine's answer under the new version. Here the deploy lands right after store's first read of the version."""
    cache = ResponseCache(CacheConfig(), engine_sha="old")
    got = cache.lookup(_req("q"))
    plain = ResponseCache.version

    def version(self: ResponseCache) -> str:
        value = plain.fget(self)  # type: ignore[attr-defined]
        self.engine_sha = "new"  # the subscriber thread applies a deploy just after this read
        return value  # type: ignore[no-any-return]

    monkeypatch.setattr(ResponseCache, "version", property(version))
    entry = cache.store(got.key, "old engine's answer", version=got.version)
    monkeypatch.undo()
    assert entry is None or entry.version == got.version  # never the old answer under the new version
    assert not cache.lookup(_req("q")).hit


def test_a_failed_refresh_serves_the_stale_answer(redis_server) -> None:  # type: ignore[no-untyped-def]
    """The caller told to refresh a stale answer got the compute's exception, while every other caller of the stale
    period got the stale answer: it now gets that answer too (stale-if-error), and the next stale lookup refreshes
    again. A miss whose compute fails still raises: there is nothing to serve."""
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace=f"t:sie{time.time_ns()}",
                      ttl_qa_s=1.0, stale_grace_s=30.0)
    cache = ResponseCache(cfg, engine_sha="e")
    assert cache.l2 is not None

    def fails(_r: object) -> str:
        raise RuntimeError("the scheduler refused it")

    try:
        cache.serve(_req("q"), lambda _r: "v1")
        cache.l2.flush()
        time.sleep(1.2)  # past the logical expiry, inside the grace
        cache.l1.clear()
        value, got = cache.serve(_req("q"), fails)
        assert value == "v1" and got.stale and got.refresh
        assert cache.lookup(_req("q")).value == "v1"
        with pytest.raises(RuntimeError):
            cache.serve(_req("never stored"), fails)
    finally:
        cache.close()
