"""The packed L2 flush against a real redis-server: byte-exact framing, per-entry TTLs, refused SETs counted while
the rest land (the server killed mid-run is test_tiers.py's outage test)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from trtforge.scheduler.cache.entry import CacheConfig, Entry
from trtforge.scheduler.cache.front import ResponseCache
from trtforge.scheduler.cache.l2wire import send_sets

pytest.importorskip("prometheus_client", reason="cache metrics need prometheus_client (trtforge[sim])")


def test_packed_sets_are_byte_exact_with_their_own_ttls(redis_server) -> None:  # type: ignore[no-untyped-def]
    import redis

    rng = random.Random(1601)
    # Values holding RESP framing itself ("\r\n", "$", "*") and every byte value: the lengths, not delimiters, count.
    batch = [(f"t:wire:{i}", bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300))) + b"\r\n$3\r\n*1",
              rng.randrange(20_000, 90_000)) for i in range(200)]
    for protocol in (2, 3):  # RESP2: replies counted in bulk; RESP3: one read_response each
        pool = redis.BlockingConnectionPool.from_url(redis_server.url, max_connections=32, protocol=protocol)
        batch = [(f"t:wire:{protocol}:{i}", blob, ttl_ms) for i, (_, blob, ttl_ms) in enumerate(batch)]
        assert send_sets(pool, batch) == 0
        client = redis.Redis(connection_pool=pool)
        for name, blob, ttl_ms in batch:
            assert client.get(name) == blob
            assert 0 < client.pttl(name) <= ttl_ms
        assert client.ping()  # the connection's reply stream is still in step after the batch
        conn = pool.get_connection()
        try:  # this redis-py has the internals the bulk reply count needs, so RESP2 took that path
            assert conn._sock is not None and conn._parser._buffer.unread_bytes() == 0 and conn.protocol == protocol
        finally:
            pool.release(conn)
        pool.disconnect()


def test_refused_sets_are_counted_and_the_rest_land(own_redis) -> None:  # type: ignore[no-untyped-def]
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=own_redis.url, namespace="t:oom", flush_entries=10**6,
                      flush_interval_s=60.0, buffer_max=10**6)
    cache = ResponseCache(cfg, engine_sha="e1")
    client = cache.l2.client
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(client.info("memory")["used_memory"] + 2_000_000))
    now = time.time()
    entries = [Entry(f"{i:064x}", "x" * 20_000, now, now + 120, cache.version) for i in range(300)]
    for e in entries:
        cache.l2.put(cache.version, e, now)
    sent = cache.l2.flush()
    refused = cache.metrics.value("cache_dropped_writes_total", reason="refused")
    stored = [e for e in entries if client.exists(cache.l2.name(cache.version, e.digest))]
    assert sent == 300 and 0 < refused < 300 and len(stored) + refused == 300  # OOM refusals, not an outage
    for e in stored:
        assert Entry.from_bytes(client.get(cache.l2.name(cache.version, e.digest)), e.digest) == e
    assert cache.metrics.value("cache_l2_up") == 1
    cache.close()


def test_bulk_reply_count_handles_split_reads_and_errors() -> None:
    """The flush's replies are counted from raw reads: CRLFs split across reads, error lines among +OK lines."""
    import socket

    import redis.exceptions

    from trtforge.scheduler.cache.l2wire import _count_refused

    rng = random.Random(1602)
    for _ in range(20):
        replies = [b"+OK\r\n" if rng.random() < 0.8 else b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"
                   for _ in range(rng.randrange(1, 40))]
        stream = b"".join(replies)
        a, b = socket.socketpair()
        with a, b:
            b.settimeout(2.0)
            cuts = sorted(rng.sample(range(1, len(stream)), min(5, len(stream) - 1)))
            pieces = [stream[lo:hi] for lo, hi in zip([0, *cuts], [*cuts, len(stream)], strict=True)]

            def feed(sock: socket.socket = a, pieces: list[bytes] = pieces) -> None:
                for piece in pieces:  # apart in time, so the reader sees them in separate reads
                    sock.sendall(piece)
                    time.sleep(0.002)

            writer = threading.Thread(target=feed)
            writer.start()
            assert _count_refused(b, len(replies)) == sum(r.startswith(b"-") for r in replies)
            writer.join()
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"+OK\r\n:1\r\n")  # not a SET's reply: the stream is out of step
        with pytest.raises(redis.exceptions.InvalidResponse):
            _count_refused(b, 2)
        a.close()
        with pytest.raises(redis.exceptions.ConnectionError):
            _count_refused(b, 1)


def test_entry_bytes_are_those_of_the_non_str_keys_encoder() -> None:
    """An entry is encoded without OPT_NON_STR_KEYS first (cheaper): the same bytes as with it, on seeded random
    values with str keys, and the option's bytes when a value has other keys."""
    orjson = pytest.importorskip("orjson")
    from trtforge.scheduler.cache.entry import _encode

    rng = random.Random(1605)

    def value(depth: int) -> object:
        pick = rng.randrange(5 if depth < 3 else 3)
        if pick == 0:
            return rng.choice([None, True, 0, -7, 1 << 62, 0.1, -0.0, 1e300])
        if pick == 1:
            return rng.choice(["", "answer", "é\u2028\U0001f600", 'q"\\\x00'])
        if pick == 2:
            return rng.choice([[], {}])
        if pick == 3:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        keys: list[object] = ["a", "b", "é", "text"] + ([1, 2.5, None] if rng.random() < 0.2 else [])
        return {rng.choice(keys): value(depth + 1) for _ in range(rng.randrange(4))}

    for _ in range(2000):
        v = {"v": value(0), "d": "x"}
        assert _encode(v) == orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS)
