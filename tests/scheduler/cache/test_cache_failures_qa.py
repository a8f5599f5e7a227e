"""The response cache under Redis failures (held-out QA, round 2), against a real redis-server: a replica running its
own engine never takes the older stored version when its subscriber reconnects; a deploy made while Redis was down
is published once Redis is back (it was lost, and a Redis restarted from its data put the deploying replica back on
the old engine's version); the version key comes back after FLUSHALL; every tier honours the lookup's ``now``
(stale answers past TTL + grace, L1 answers past their TTL, and a fast writer clock's answers were served)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trtforge.scheduler.cache import pubsub
from trtforge.scheduler.cache.entry import CacheConfig
from trtforge.scheduler.cache.front import ResponseCache
from trtforge.scheduler.cache.keys import make_key

from .conftest import start_redis

pytest.importorskip("prometheus_client", reason="cache metrics need prometheus_client (trtforge[sim])")


def _req(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0}


def _until(cond: object, seconds: float = 8.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


def test_own_engine_is_kept_when_the_subscriber_reconnects(redis_server) -> None:  # type: ignore[no-untyped-def]
    """A replica started with its own engine sha does not adopt the older stored version at start-up; it did adopt
    it when its subscriber reconnected (any dropped connection), and then served the old engine's entries."""
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace=f"t:own{time.time_ns()}")
    old = ResponseCache(cfg, engine_sha="x")
    old.set_engine("old-engine")  # the stored version, from an earlier deploy
    new = ResponseCache(cfg, engine_sha="new-engine")
    assert new.invalidation is not None and new.l2 is not None
    caught_up = threading.Event()
    plain = new.invalidation._catch_up

    def catch_up() -> None:  # the reconnect's catch-up, observed (the real one runs)
        plain()
        caught_up.set()

    new.invalidation._catch_up = catch_up  # type: ignore[method-assign]
    try:
        new.store(make_key(_req("q")), "new engine's answer")
        new.l2.client.client_kill_filter(_type="pubsub")  # every subscriber's connection drops
        assert caught_up.wait(8.0)
        assert new.engine_sha == "new-engine" and new.lookup(_req("q")).value == "new engine's answer"
        assert old.engine_sha == "old-engine"
    finally:
        old.close()
        new.close()


def test_deploy_during_an_outage_is_published_when_redis_is_back(tmp_path: Path) -> None:
    """Redis down (kill -9) while a replica deploys a new engine: the publish failed and was never retried, so other
    replicas kept the old version for good; and when Redis came back with its data (append-only file) the
    deploying replica's catch-up took the stored old version."""
    server = start_redis(None, "--appendonly", "yes", "--appendfsync", "always", "--dir", str(tmp_path))
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=server.url, namespace="t:pending")
    a = ResponseCache(cfg, engine_sha="x")
    a.set_engine("old-engine")
    b = ResponseCache(cfg)
    try:
        assert b.engine_sha == "old-engine"
        server.stop()
        a.set_engine("new-engine")  # applied here; Redis refuses the connection
        assert a.invalidation is not None and a.invalidation.pending == ("new-engine", 1)
        server.restart()  # back on the same port, with the old version key
        _until(lambda: b.engine_sha == "new-engine" and a.invalidation.pending is None)  # type: ignore[union-attr]
        assert (a.engine_sha, b.engine_sha) == ("new-engine", "new-engine")
        assert a.invalidation.stored() == ("new-engine", 1)
        later = ResponseCache(cfg)
        assert later.engine_sha == "new-engine"
        later.close()
    finally:
        a.close()
        b.close()
        server.stop()


def test_version_key_comes_back_after_flushall(redis_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """FLUSHALL (or an allkeys-lru eviction, where the rarely read version key goes first) lost the version key for
    good: replicas started later kept "none" and never shared the deployed version's entries."""
    monkeypatch.setattr(pubsub, "KEEP_S", 0.2)
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace=f"t:flush{time.time_ns()}")
    a = ResponseCache(cfg, engine_sha="x")
    a.set_engine("deployed")
    assert a.l2 is not None
    a.l2.client.flushall()
    late = ResponseCache(cfg)  # started while the key is gone
    try:
        _until(lambda: late.engine_sha == "deployed")
        assert late.engine_sha == "deployed" and late.version == a.version
        assert a.invalidation is not None and a.invalidation.stored() == ("deployed", 1)
    finally:
        a.close()
        late.close()


def test_every_tier_honours_the_lookups_now(redis_server) -> None:  # type: ignore[no-untyped-def]
    """TTL 10 s, grace 5 s. L2 served the answer as stale at any ``now`` past the grace (Redis keeps the key by the
    writer's clock); L1 served it fresh whatever ``now`` said; a writer clock 1000 s ahead made its answer fresh,
    and copied into L1, for those 1000 s."""
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace=f"t:now{time.time_ns()}",
                      ttl_qa_s=10.0, stale_grace_s=5.0)
    a, b = ResponseCache(cfg, engine_sha="e"), ResponseCache(cfg, engine_sha="e")
    assert a.l2 is not None and b.metrics is not None
    try:
        t = time.time()
        a.store(make_key(_req("q")), "v", now=t)
        a.store(make_key(_req("ahead")), "from a fast clock", now=t + 1000.0)
        a.l2.flush()
        for dt, layer, stale in [(0, "l2", False), (9, "l2", False), (11, "l2", True), (14, "l2", True),
                                 (16, None, False), (10_000, None, False)]:
            b.l1.clear()
            got = b.lookup(_req("q"), now=t + dt)
            assert (got.layer, got.stale) == (layer, stale), dt
        for dt, layer in [(0, "l1"), (11, "l2"), (10_000, None)]:  # past the TTL: L2's stale copy, not L1's
            assert a.lookup(_req("q"), now=t + dt).layer == layer, dt
        got = b.lookup(_req("ahead"), now=t)
        assert got.stale and got.refresh and got.value == "from a fast clock"  # rewritten by this caller's clock
        assert b.lookup(_req("ahead"), now=t).layer == "l2"  # not copied into L1
    finally:
        a.close()
        b.close()


def test_a_failed_catch_up_read_is_tried_again(redis_server) -> None:  # type: ignore[no-untyped-def]
    """The reconnecting subscriber read the version key to catch up on what it missed; a read that failed (here:
    no pooled connection free, as when a Redis restart leaves them all reconnecting; or LOADING) counted as
    "nothing stored", so an invalidation published while the subscriber was away was lost for good."""
    import redis

    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace=f"t:retry{time.time_ns()}")
    a, b = ResponseCache(cfg, engine_sha="old"), ResponseCache(cfg, engine_sha="old")
    assert a.l2 is not None and b.l2 is not None
    held = []
    try:
        a.l2.client.client_kill_filter(_type="pubsub")  # b's subscriber is away for a second
        a.set_engine("new")  # published while b cannot hear it
        while True:  # every other connection of b's pool: b's subscriber comes back, its catch-up read cannot
            try:
                held.append(b.l2.pool.get_connection())
            except redis.ConnectionError:
                break
        time.sleep(1.5)  # the subscriber is back (it has the dead subscription's connection) and tried to catch up
    finally:
        for conn in held:
            b.l2.pool.release(conn)
    try:
        _until(lambda: b.engine_sha == "new", 5.0)
        assert b.engine_sha == "new"
    finally:
        a.close()
        b.close()


def _deploy_at_once(cfg: CacheConfig, trial: int) -> None:
    a, b = ResponseCache(cfg, engine_sha="v0"), ResponseCache(cfg, engine_sha="v0")
    barrier = threading.Barrier(2)

    def deploy(cache: ResponseCache, sha: str) -> None:
        barrier.wait()
        cache.set_engine(sha)

    threads = [threading.Thread(target=deploy, args=(a, f"x{trial}")),
               threading.Thread(target=deploy, args=(b, f"y{trial}"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.invalidation is not None
    inv = a.invalidation
    try:
        _until(lambda: a.engine_sha == b.engine_sha == (inv.stored() or ("",))[0], 3.0)
        assert a.engine_sha == b.engine_sha == (inv.stored() or ("",))[0], trial
    finally:
        a.close()
        b.close()


def test_concurrent_deploys_converge_on_one_version(redis_server) -> None:  # type: ignore[no-untyped-def]
    """Two replicas publishing different versions at once each applied the other's message and kept the swapped
    versions for good (20 of 20 trials), while the key held one of them for replicas started later."""
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace=f"t:race{time.time_ns()}")
    for trial in range(4):
        _deploy_at_once(cfg, trial)


def test_deploy_at_maxmemory_keeps_its_version_and_reaches_the_others(own_redis, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """At maxmemory (noeviction) the version key's SET is refused: the live replicas hear the deploy at once (a
    bare PUBLISH; they must not keep serving the old engine's L1 answers while Redis is full), the deploying
    replica keeps its version, and the key follows once memory is back (it kept the old version for good, so
    replicas started later, or catching up after a reconnect, took the old one)."""
    monkeypatch.setattr(pubsub, "KEEP_S", 0.2)
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=own_redis.url, namespace="t:oom")
    a = ResponseCache(cfg, engine_sha="x")
    a.set_engine("old")
    b = ResponseCache(cfg)
    assert a.l2 is not None and a.invalidation is not None
    try:
        a.l2.client.config_set("maxmemory-policy", "noeviction")
        a.l2.client.config_set("maxmemory", "1")
        a.set_engine("new")
        _until(lambda: b.engine_sha == "new", 3.0)
        time.sleep(0.5)  # a few upkeep rounds, refused
        assert (a.engine_sha, b.engine_sha, a.invalidation.pending) == ("new", "new", ("new", 1))
        assert a.invalidation.stored() == ("old", 1)
        a.l2.client.config_set("maxmemory", "0")
        _until(lambda: b.engine_sha == "new" and a.invalidation.pending is None)  # type: ignore[union-attr]
        assert (a.engine_sha, b.engine_sha, a.invalidation.stored()) == ("new", "new", ("new", 1))
    finally:
        a.close()
        b.close()


def test_l2_up_follows_redis_without_traffic(own_redis, caplog) -> None:  # type: ignore[no-untyped-def]
    """``cache_l2_up`` and the warnings changed only when a request touched L2: an idle replica showed 1 for a
    dead Redis, and 0 (no "back" warning) for one that had returned."""
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=own_redis.url, namespace="t:idle")
    cache = ResponseCache(cfg, engine_sha="e")
    assert cache.metrics is not None
    try:
        own_redis.stop()
        _until(lambda: cache.metrics.value("cache_l2_up") == 0, 5.0)  # type: ignore[union-attr]
        assert cache.metrics.value("cache_l2_up") == 0
        assert any("unreachable" in r.getMessage() for r in caplog.records)
        own_redis.restart()
        _until(lambda: cache.metrics.value("cache_l2_up") == 1, 5.0)  # type: ignore[union-attr]
        assert cache.metrics.value("cache_l2_up") == 1
        assert any("is back" in r.getMessage() for r in caplog.records)
    finally:
        cache.close()


def test_a_password_set_mid_run_is_named_and_the_tier_comes_back(own_redis, caplog) -> None:  # type: ignore[no-untyped-def]
    """CONFIG SET requirepass while replicas run: new connections are refused the login; the warning said Redis was
    "unreachable". Requests are still answered (L1 or computed), and the tier is back once the password is gone."""
    import redis

    cfg = CacheConfig(layers=("l1", "l2"), redis_url=own_redis.url, namespace="t:auth")
    cache = ResponseCache(cfg, engine_sha="e")
    admin = redis.Redis.from_url(own_redis.url)
    assert cache.l2 is not None and cache.metrics is not None
    try:
        cache.serve(_req("before"), lambda _r: "B")
        cache.l2.flush()
        admin.config_set("requirepass", "s3cret")
        admin.client_kill_filter(_type="normal", skipme=True)  # the replica's pooled connections must log in again
        cache.l1.clear()
        assert cache.serve(_req("before"), lambda _r: "computed")[0] == "computed"  # answered by the scheduler
        assert cache.metrics.value("cache_l2_up") == 0
        assert any("password" in r.getMessage() for r in caplog.records)
        assert not any("unreachable" in r.getMessage() for r in caplog.records)
        admin.config_set("requirepass", "")
        _until(lambda: cache.metrics.value("cache_l2_up") == 1, 5.0)  # type: ignore[union-attr]
        cache.l1.clear()
        assert cache.lookup(_req("before")).layer == "l2"
    finally:
        cache.close()
