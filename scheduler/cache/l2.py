"""L2: a Redis tier shared by every replica.

- A ``BlockingConnectionPool`` of ``pool_size`` (>= 32) connections with short socket timeouts.
- Writes are buffered and sent by one background thread as one non-transactional pipeline (packed once into RESP
  bytes, ``l2wire``) every ``flush_interval_s`` (100 ms) or as soon as ``flush_entries`` are waiting, never one
  round trip per response. A SET the server refuses (e.g. out of memory) is dropped and counted. The buffer is
  bounded (``buffer_max``): when full, the oldest write is dropped and counted. An answer that JSON cannot hold
  exactly (``entry.Entry.to_bytes``) is not written (counted as ``unencodable``, one warning); L1 still serves it.
  Nor is one longer than the server's ``proto-max-bulk-len`` (read at start-up; 512 MiB, Redis' default, when
  ``CONFIG`` is refused): counted as ``too_large``, one warning. Redis answers such a SET with a protocol error and
  closes the connection, so it took the tier down as an outage and dropped the whole flush with it.
- Each key lives ``stale_grace_s`` past its logical expiry (stored in the value), so a stale answer can be served
  while one caller, the one that wins ``claim_refresh`` (``SET NX``), recomputes it.
- Every pooled connection busy for the pool's timeout (0.2 s) is not an outage: that lookup is a miss (counted
  ``result="busy"``), a flush keeps its writes for the next one, no warning, the tier stays up (it was marked down
  for ``retry_s`` with an "unreachable" warning, and most lookups then missed, while Redis answered).
- An outage (connection refused, timeout) marks the tier down for ``retry_s``: lookups return at once (the request
  is answered from L1 or computed), writes are dropped with a count, one warning is logged per outage, and
  ``cache_l2_up`` is 0. Nothing waits on a dead server for longer than one socket timeout. With no traffic the
  flusher PINGs once per ``retry_s``, so the gauge and the warnings follow Redis on an idle replica too.
- Key names carry the cache version, so entries of an old engine are never even found.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Any, cast

from .entry import CacheConfig, Entry, redact_url
from .l2wire import pack_set, send_packed

log = logging.getLogger(__name__)
DEFAULT_MAX_BULK = 512 * 2**20  # Redis' default proto-max-bulk-len: no SET argument may be longer


def _pool_busy(exc: BaseException) -> bool:
    """Every pooled connection was in use for the pool's whole timeout: Redis is up, this process is busy.
    (redis-py raises ConnectionError("No connection available.") while handling the pool queue's Empty.)"""
    return isinstance(exc.__context__, queue.Empty)


class L2:
    def __init__(self, cfg: CacheConfig, metrics: Any = None, retry_s: float = 1.0) -> None:
        import redis

        self.cfg = cfg
        self._url = redact_url(cfg.redis_url)  # as warnings name it: never its password
        self.metrics = metrics
        self.retry_s = retry_s
        self._errors = (redis.RedisError, OSError)
        # What is an outage: the server cannot be reached or answer. Any other error is about one command (a key
        # of another type: WRONGTYPE; OOM refusing a claim; an ACL): that lookup fails alone, the tier stays up.
        self._outage = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError)
        self._warned_command = False
        # RESP2: a command connection then carries only replies, never a push message (RESP3 may interleave
        # them: tracking, maintenance notifications), so a flush's N SET replies are exactly N lines (l2wire).
        self.pool = redis.BlockingConnectionPool.from_url(
            cfg.redis_url, max_connections=cfg.pool_size, timeout=0.2, socket_timeout=0.25,
            socket_connect_timeout=0.25, protocol=2)
        self.client = redis.Redis(connection_pool=self.pool)
        self._buffer: collections.deque[bytes] = collections.deque()  # packed SET commands (l2wire)
        self._prefixes: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._down_until = 0.0
        self._warned = False
        self._warned_value = False
        self._warned_size = False
        self.dropped = 0
        self.flushes = 0
        self._thread = threading.Thread(target=self._flusher, name="trtforge-cache-l2", daemon=True)
        self._thread.start()
        if metrics is not None:
            metrics.l2_up.set(1)
            # Read when scraped: a live depth, and no gauge update (a lock) on every write.
            metrics.buffer_depth.set_function(lambda: len(self._buffer))
        self.max_value_bytes = DEFAULT_MAX_BULK
        try:  # unreachable at start-up: warn now and serve from L1 (the library never fails a request for it)
            self.client.ping()
            self.max_value_bytes = self._bulk_limit()
        except self._errors as exc:
            self._failed(exc)

    def _bulk_limit(self) -> int:
        """The server's largest argument (``proto-max-bulk-len``); Redis' default where CONFIG is not allowed."""
        try:
            got = cast("dict[Any, Any]", self.client.config_get("proto-max-bulk-len"))
            value = got.get(b"proto-max-bulk-len", got.get("proto-max-bulk-len"))
            return int(value) if value is not None else DEFAULT_MAX_BULK
        except self._outage:
            raise
        except (self._errors[0], ValueError):  # CONFIG renamed or forbidden by an ACL: assume the default
            return DEFAULT_MAX_BULK

    # --- health -------------------------------------------------------------------------------------------------
    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except self._errors:
            return False

    @property
    def up(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, exc: BaseException) -> None:
        self._down_until = time.monotonic() + self.retry_s
        if self.metrics is not None:
            self.metrics.l2_up.set(0)
        if not self._warned:
            self._warned = True
            # A password set on the server mid-run (CONFIG SET requirepass) answers every new connection with an
            # AuthenticationError: Redis is there, the URL lacks the password ("unreachable" sent operators looking
            # for a dead server).
            what = ("refused the login (a wrong or missing password in redis_url)" if self._auth(exc)
                    else f"is unreachable ({type(exc).__name__})")
            log.warning("response cache: Redis at %s %s; serving from L1 only until it is back", self._url,
                        what)

    @staticmethod
    def _auth(exc: BaseException) -> bool:
        from redis import AuthenticationError

        return isinstance(exc, AuthenticationError)

    def _command_failed(self, exc: BaseException) -> None:
        if not self._warned_command:
            self._warned_command = True
            log.warning("response cache: Redis at %s refused a command (%s: %s); that lookup misses, the tier stays "
                        "up", self._url, type(exc).__name__, str(exc)[:120])

    def _ok(self) -> None:
        if self._warned:
            log.warning("response cache: Redis at %s is back", self._url)
        self._warned = False
        if self.metrics is not None:
            self.metrics.l2_up.set(1)

    # --- reads --------------------------------------------------------------------------------------------------
    def name(self, version: str, digest: str) -> str:
        return f"{self.cfg.namespace}:e:{version}:{digest}"

    def get(self, version: str, digest: str) -> tuple[bytes | None, str]:
        """(raw value or None, outcome): outcome is "ok", "miss", "busy", "corrupt" (the key holds something else
        than a string) or "down"."""
        if not self.up:
            return None, "down"
        try:
            # The pool is built without decode_responses, so Redis hands back bytes (redis-py types it bytes | str).
            raw = cast("bytes | None", self.client.get(self.name(version, digest)))
        except self._errors as exc:
            if _pool_busy(exc):  # a miss for this lookup, not an outage: no warning, the tier stays up
                return None, "busy"
            if not isinstance(exc, self._outage):  # e.g. WRONGTYPE: this key is unreadable, Redis is fine
                self._command_failed(exc)
                return None, "corrupt"
            self._failed(exc)
            return None, "down"
        self._ok()
        return (raw, "ok") if raw is not None else (None, "miss")

    def claim_refresh(self, version: str, digest: str, hold_s: float = 30.0) -> bool:
        """True for exactly one caller per stale entry, for ``hold_s`` (the front holds it at most the entry's TTL,
        so a refreshed answer that goes stale again is refreshed again)."""
        if not self.up:
            return False
        try:
            return bool(self.client.set(f"{self.cfg.namespace}:r:{version}:{digest}", b"1", nx=True,
                                        px=max(1, int(hold_s * 1000))))  # PX 0 is refused: nobody refreshed
        except self._errors as exc:
            if not isinstance(exc, self._outage):
                self._command_failed(exc)
            elif not _pool_busy(exc):
                self._failed(exc)
            return False

    # --- writes -------------------------------------------------------------------------------------------------
    def put(self, version: str, entry: Entry, now: float | None = None) -> None:
        now = time.time() if now is None else now
        ttl_ms = max(1, int((entry.expires + self.cfg.stale_grace_s - now) * 1000))
        prefix = self._prefixes.get(version)
        if prefix is None:  # the constant part of the key name, encoded once per version (few versions live)
            if len(self._prefixes) >= 64:
                self._prefixes.clear()
            prefix = self._prefixes[version] = self.name(version, "").encode()
        # Serialised and packed outside the lock: a flush then only joins and sends.
        try:
            blob = entry.to_bytes()
        except ValueError as exc:  # a value JSON cannot hold exactly: never fail the request, never serve another
            self._drop("unencodable")
            if not self._warned_value:
                self._warned_value = True
                log.warning("response cache: an answer was not written to Redis (%s); such answers are served "
                            "from L1 only (counted as cache_dropped_writes_total{reason=\"unencodable\"})", exc)
            return
        if len(blob) > self.max_value_bytes:  # Redis would drop the connection, and the whole flush with it
            self._drop("too_large")
            if not self._warned_size:
                self._warned_size = True
                log.warning("response cache: an answer of %d bytes was not written to Redis (its proto-max-bulk-len "
                            "is %d); such answers are served from L1 only (counted as cache_dropped_writes_total"
                            "{reason=\"too_large\"})", len(blob), self.max_value_bytes)
            return
        write = pack_set(prefix + entry.digest.encode(), blob, ttl_ms)
        with self._lock:
            if len(self._buffer) >= self.cfg.buffer_max:
                self._buffer.popleft()
                self._drop("buffer_full")
            self._buffer.append(write)
            depth = len(self._buffer)
        if depth >= self.cfg.flush_entries and not self._wake.is_set():  # set() takes a lock: once per batch
            self._wake.set()

    def _drop(self, reason: str, n: int = 1) -> None:
        self.dropped += n
        if self.metrics is not None:
            self.metrics.dropped.labels(reason=reason).inc(n)

    def flush(self) -> int:
        """Send every buffered write as one pipeline; returns how many were sent (0 when down: they are dropped)."""
        with self._lock:
            batch = list(self._buffer)
            self._buffer.clear()
        if not batch:
            return 0
        if not self.up:
            self._drop("outage", len(batch))
            return 0
        t0 = time.perf_counter()
        try:
            refused = send_packed(self.pool, batch)
        except self._errors as exc:
            if _pool_busy(exc):  # no connection free (Redis is up): the writes wait for the next flush
                self._requeue(batch)
                return 0
            self._failed(exc)
            self._drop("outage", len(batch))
            return 0
        self._ok()
        if refused:
            self._drop("refused", refused)
        self.flushes += 1
        if self.metrics is not None:
            self.metrics.flush.observe(time.perf_counter() - t0)
        return len(batch)

    def _requeue(self, batch: list[bytes]) -> None:
        """Put an unsent batch back in front of the newer writes, keeping the buffer's bound (oldest dropped)."""
        with self._lock:
            self._buffer.extendleft(reversed(batch))
            over = len(self._buffer) - self.cfg.buffer_max
            for _ in range(max(0, over)):
                self._buffer.popleft()
        if over > 0:
            self._drop("buffer_full", over)

    def _flusher(self) -> None:
        probe = 0.0
        while not self._closed:
            self._wake.wait(self.cfg.flush_interval_s)
            self._wake.clear()
            sent = self.flush()
            if time.monotonic() >= probe:  # once per retry_s: health without traffic
                probe = time.monotonic() + self.retry_s
                if not sent:
                    self._probe()

    def _probe(self) -> None:
        """PING when no flush spoke to Redis: ``cache_l2_up`` and the down/back warnings follow Redis on an idle
        replica too (they changed only with traffic: 1 for a dead Redis, 0 and no "back" for one that returned)."""
        if not self.up:
            return
        try:
            self.client.ping()
        except self._errors as exc:
            if isinstance(exc, self._outage) and not _pool_busy(exc):
                self._failed(exc)
            return
        self._ok()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=2)
        self.flush()
        self.pool.disconnect()
