"""Measured lookup costs of the response cache's real tiers, for ``simulate --response-cache``.

At start-up the simulator builds a real ``ResponseCache`` with the requested tiers (cachetools L1, the redis-server
at ``--redis-url`` for L2, a FAISS index for L3), fills it with ``fill`` answers, and times ``lookups`` lookups of
each outcome; the median of each is what a simulated request pays:

- ``hit["l1"]``: key + L1 get; ``hit["l2"]``: key + L1 miss + one Redis GET (+ promotion into L1);
- ``hit["l3"]``: key + L1 miss + L2 miss + embedding + FAISS search over ``fill`` entries (a near-duplicate);
- ``miss``: every configured tier misses (what a request pays before it reaches the scheduler).

The measuring cache writes under its own namespace and deletes its keys afterwards.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trtforge.build_engine.core.errors import InputError, TrtforgeError

from ..cache.entry import CacheConfig


@dataclass(frozen=True)
class TierCosts:
    """Median lookup seconds by outcome (measured, see the module docstring)."""

    hit: dict[str, float] = field(default_factory=dict)
    miss: float = 0.0
    fill: int = 0
    lookups: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"hit_us": {k: round(v * 1e6, 1) for k, v in self.hit.items()}, "miss_us": round(self.miss * 1e6, 1),
                "measured_with_entries": self.fill, "lookups_each": self.lookups}


def check_redis(url: str) -> None:
    """Exit-2 material when ``url`` is not a reachable Redis (the command refuses to start; the library degrades)."""
    import redis

    from ..cache.entry import check_redis_db, redact_url

    check_redis_db(url)
    given, url = url, redact_url(url)  # the messages name it without its password
    try:
        client = redis.Redis.from_url(given, socket_timeout=1.0, socket_connect_timeout=1.0)
    except ValueError as exc:
        raise InputError(f"--redis-url {url}: not a Redis URL ({exc}); use redis://host:port/db") from exc
    try:
        client.ping()
    except redis.AuthenticationError as exc:  # it answers, and wants a password (or another one)
        raise InputError(f"--redis-url {url}: Redis refused the login (a wrong or missing password); give it in the "
                         "URL (redis://:PASSWORD@host:port/db)") from exc
    except redis.ResponseError as exc:  # it answers, and refused the connection's set-up (e.g. a db out of range)
        raise InputError(f"--redis-url {url}: Redis refused the connection ({str(exc)[:120]}); fix the URL") from exc
    except (redis.RedisError, OSError) as exc:
        raise InputError(f"--redis-url {url}: cannot reach Redis ({type(exc).__name__}); start redis-server "
                         "(apt-get install redis-server) or fix the URL") from exc
    finally:
        client.close()


def _request(i: int, variant: str = "?") -> dict[str, Any]:
    return {"model": "sim", "temperature": 0, "messages": [
        {"role": "user", "content": f"Why was invoice {i * 7919 % 100_003} of customer {i} charged twice{variant}"}]}


def _unseen(i: int) -> dict[str, Any]:
    return {"model": "sim", "temperature": 0, "messages": [
        {"role": "user", "content": f"List the parcel tracking events of shipment {i} to depot {i % 97}."}]}


def _median(fn: Callable[[int], Any], n: int) -> float:
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat)


def measure(tiers: tuple[str, ...], *, redis_url: str | None = None, pool_size: int = 32, fill: int = 2000,
            lookups: int = 200) -> TierCosts:
    """Time the real tiers (see the module docstring); ``redis_url`` is required when ``"l2"`` is in ``tiers``."""
    from ..cache.entry import redact_url
    from ..cache.front import ResponseCache
    from ..cache.keys import make_key

    lookups = max(1, min(lookups, fill))
    cfg = CacheConfig(layers=tiers, redis_url=redis_url or CacheConfig.redis_url, pool_size=pool_size,
                      l1_entries=max(fill, 1), flush_entries=512, buffer_max=max(10_000, fill),
                      namespace=f"trtforge:sim-measure:{uuid.uuid4().hex[:8]}")
    if "l2" in tiers:
        if not redis_url:
            raise InputError(f"--response-cache {','.join(tiers)} needs --redis-url redis://host:port/db")
        check_redis(redis_url)
    writer = ResponseCache(cfg, engine_sha="sim", metrics=False)
    reader = ResponseCache(cfg, engine_sha="sim", metrics=False) if "l2" in tiers else None
    try:
        for i in range(fill):
            writer.store(make_key(_request(i)), {"text": "a cached answer"})
        if writer.l2 is not None:
            writer.l2.flush()
            if writer.l2.dropped:  # refused (OOM) or lost: the L2 lookups would miss ("expected a l2, got miss")
                raise InputError(f"--redis-url {redact_url(redis_url or '')}: Redis did not take {writer.l2.dropped} "
                                 f"of {fill} "
                                 "measurement writes (out of memory at maxmemory, or unreachable); free memory or "
                                 "raise maxmemory and rerun")
        hit = {"l1": _median(lambda i: _expect(writer.lookup(_request(i)), "l1"), lookups)}
        if reader is not None:  # a fresh L1: every first lookup is served by Redis
            hit["l2"] = _median(lambda i: _expect(reader.lookup(_request(i)), "l2"), lookups)
        if "l3" in tiers:  # "!" instead of "?": another key, a near-duplicate text
            hit["l3"] = _median(lambda i: _expect(writer.lookup(_request(i, "!")), "l3"), lookups)
        miss = _median(lambda i: _expect(writer.lookup(_unseen(i)), None), lookups)
    finally:
        _cleanup(writer, cfg.namespace)
        for c in (writer, reader):
            if c is not None:
                c.close()
    return TierCosts(hit=hit, miss=miss, fill=fill, lookups=lookups)


def _expect(got: Any, layer: str | None) -> None:
    if got.layer != layer:  # a measurement of the wrong outcome would be a wrong number, not a slow one
        raise TrtforgeError(f"response-cache measurement: expected a {layer or 'miss'}, got {got.layer or 'miss'}")


def _cleanup(cache: Any, namespace: str) -> None:
    if cache.l2 is None:
        return
    try:
        keys = list(cache.l2.client.scan_iter(match=f"{namespace}:*", count=1000))
        for start in range(0, len(keys), 1000):
            cache.l2.client.delete(*keys[start:start + 1000])
    except Exception:  # the measurement's keys expire on their own (TTL); cleaning up is a courtesy
        pass
