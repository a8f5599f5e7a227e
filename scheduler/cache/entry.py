"""Response-cache configuration and the stored entry (with its integrity check).

An entry carries its *logical* expiry (the TTL of its session class) and the cache *version* it was written under
(engine manifest sha256 + semantic-index version). Redis keeps it ``stale_grace_s`` past the logical expiry so a
stale answer can be served while one refresh runs; an entry of another version is never served.

Stored bytes (L2, ``l3.json``) hold JSON, and only a value that reads back *equal* is stored: a ``bytes`` value
(a binary response) is stored as base64 and read back as the same bytes; a value JSON cannot hold exactly (nested
bytes, a set, NaN or infinity, which JSON writes as null, non-string keys, tuples, integers past 64 bits) makes
``to_bytes`` raise ValueError, so the tier drops that write (counted) instead of serving another value later.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from trtforge.build_engine.core.errors import InputError

LAYERS = ("l1", "l2", "l3")

try:  # orjson (the cache extra) encodes an entry in ~0.7 us where the stdlib takes 5-7 us: most of an L2 write's cost
    import orjson

    def _encode(obj: Any) -> bytes:
        # Plain first: OPT_NON_STR_KEYS costs ~0.2 us on every write (a third of the encode) and changes nothing
        # for str keys; only a value with other keys takes the second call.
        try:
            return orjson.dumps(obj)
        except TypeError:
            return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)

    _decode: Any = orjson.loads  # its JSONDecodeError is a ValueError, as the stdlib's
except ImportError:  # the same JSON through the stdlib (one encoder object, not one per call)
    _stdlib = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode

    def _encode(obj: Any) -> bytes:
        return _stdlib(obj).encode()

    _decode = json.loads


def check_redis_db(url: str) -> None:
    """A ``redis://``/``rediss://`` URL's path is its database number: redis-py reads ``/cache`` or ``/l`` (a typo of
    ``/1``) as database 0 and ``/1/2`` as 12, without a word, so replicas and ``cache invalidate`` could talk to
    different databases (the stored cache version is per database). Anything but ``/N`` is an InputError."""
    from urllib.parse import unquote, urlsplit

    if not url.startswith(("redis://", "rediss://")):
        return
    try:
        path = unquote(urlsplit(url).path)
    except ValueError:
        return  # not a URL at all: redis-py names what is wrong when it parses it
    if path not in ("", "/") and not re.fullmatch(r"/[0-9]+", path):
        raise InputError(f"--redis-url {redact_url(url)}: the path {path!r} is not a database number; use "
                         "redis://host:port/N "
                         "(N = 0, 1, ...)")


def redact_url(url: str) -> str:
    """``url`` as messages and logs name it: a password (``redis://:PASSWORD@host``, ``redis://user:PASSWORD@host``,
    ``?password=PASSWORD``) as ``***``, so a warning or an error line never carries the credential."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is not None:
            user, _, host = parts.netloc.rpartition("@")
            url = urlunsplit(parts._replace(netloc=f"{user.split(':', 1)[0]}:***@{host}"))
        return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)
    except ValueError:  # not a URL at all: what stands before an '@' may be a password
        return url.split("://", 1)[0] + "://***" if "@" in url else url


def encoded_size(value: Any) -> int:
    """The length of ``value`` as JSON (``repr`` for what JSON cannot hold): what L1 counts for a non-str value."""
    try:
        return len(_encode(value))
    except (TypeError, ValueError):
        return len(repr(value))


TOOL_TASKS = frozenset({"tool", "tools", "agent", "tool-calling", "function-calling"})


@dataclass(frozen=True)
class CacheConfig:
    """Defaults follow issue 16: single-turn Q&A 120 s, multi-step tool-calling sessions 3600 s."""

    layers: tuple[str, ...] = ("l1",)
    l1_entries: int = 10_000
    l1_max_bytes: int = 256 * 2**20  # L1's byte bound (``l1.entry_bytes``), beside its entry bound
    ttl_qa_s: float = 120.0
    ttl_tool_s: float = 3600.0
    stale_grace_s: float = 60.0
    redis_url: str = "redis://127.0.0.1:6379/0"
    pool_size: int = 32
    flush_interval_s: float = 0.1
    flush_entries: int = 64
    buffer_max: int = 10_000
    l3_threshold: float = 0.9
    l3_dim: int = 256
    l3_index: str = "flat"  # flat (exact inner product) | hnsw (approximate, for 10^6+ entries)
    cache_sampled: bool = False
    namespace: str = "trtforge:rc"

    def __post_init__(self) -> None:
        bad = [x for x in self.layers if x not in LAYERS]
        if bad or not self.layers or "l1" not in self.layers:
            raise InputError(f"response cache layers {','.join(self.layers)!r}: use l1, l1,l2 or l1,l2,l3")
        if "l2" in self.layers and self.pool_size < 32:  # L2's pool: without l2 no connection is made
            raise InputError(f"redis pool size {self.pool_size} (--redis-pool-size): use at least 32 connections")
        for name in ("ttl_qa_s", "ttl_tool_s", "flush_interval_s"):
            value = getattr(self, name)
            if not 0 < value < 10**7:
                raise InputError(f"response cache {name} = {value!r}: must be a positive number of seconds")
        if not 0 <= self.stale_grace_s < 10**7:
            raise InputError(f"response cache stale_grace_s = {self.stale_grace_s!r}: must be 0 or more seconds")
        # Counts: 0 or less made the first store fail (L1: "value too large"; buffer: pop from an empty deque;
        # l3_dim: a modulo by zero in the embedding), after the answer was computed.
        for name in ("l1_entries", "l1_max_bytes", "flush_entries", "buffer_max", "l3_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"response cache {name} = {value!r}: must be a whole number of at least 1")
        if "l2" in self.layers and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise InputError(f"redis url {redact_url(self.redis_url)!r} (--redis-url): use redis://host:port/db, "
                             "rediss://... "
                             "or unix:///path")
        if "l2" in self.layers:
            check_redis_db(self.redis_url)
        if not 0.0 < self.l3_threshold <= 1.0:
            raise InputError(f"l3 threshold {self.l3_threshold!r}: a cosine similarity in (0, 1]")
        if self.l3_index not in ("flat", "hnsw"):
            raise InputError(f"l3 index {self.l3_index!r}: flat or hnsw")

    def ttl(self, task: str | None) -> float:
        return self.ttl_tool_s if (task or "").lower() in TOOL_TASKS else self.ttl_qa_s


@dataclass(frozen=True)
class Entry:
    digest: str
    value: Any
    created: float
    expires: float  # logical expiry (wall clock); served as stale until expires + stale_grace_s
    version: str
    scope: str = ""
    text: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def fresh(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) < self.expires

    def to_bytes(self) -> bytes:
        """The stored form; raises ValueError when the value would not read back equal (module docstring)."""
        # Keys unsorted: the checksum covers the stored bytes, and the reader does not depend on their order.
        binary = isinstance(self.value, bytes | bytearray)
        value = base64.b64encode(self.value).decode() if binary else self.value
        fields = {"d": self.digest, "v": value, "c": self.created, "e": self.expires, "ver": self.version,
                  "s": self.scope, "t": self.text, "m": self.meta}
        if binary:
            fields["b"] = 1
        try:
            body = _encode(fields)
        except (TypeError, ValueError) as exc:  # not JSON at all (bytes inside, a set, a 65-bit integer...)
            raise ValueError(f"the value cannot be stored as JSON ({exc})") from exc
        # A str (the common answer) always reads back equal; anything else is checked (~0.4 us for a small dict).
        if type(value) is not str and _decode(body)["v"] != value:
            raise ValueError("the value does not read back equal from JSON (NaN or infinity, non-string keys, "
                             "tuples...); such values are not stored")
        return b"%b|%b" % (hashlib.sha256(body).hexdigest()[:16].encode(), body)

    @staticmethod
    def from_bytes(raw: bytes, digest: str) -> Entry:
        """Parse and verify; raises ValueError on any corruption (checksum, shape, or another key's entry)."""
        check, _, body = raw.partition(b"|")
        if hashlib.sha256(body).hexdigest()[:16].encode() != check:
            raise ValueError("checksum mismatch")
        d = _decode(body)
        value = d["v"]
        if d.get("b"):
            try:
                value = base64.b64decode(value, validate=True)
            except (binascii.Error, TypeError) as exc:
                raise ValueError("binary value is not base64") from exc
        entry = Entry(digest=d["d"], value=value, created=_time(d["c"]), expires=_time(d["e"]),
                      version=str(d["ver"]), scope=str(d["s"]), text=str(d["t"]), meta=dict(d["m"]))
        if entry.digest != digest:
            raise ValueError("entry stored under another key")
        return entry


def _time(value: Any) -> float:
    """A stored time: a finite JSON number. ``float()`` also took the strings "inf" and "nan": an entry written so
    was served and never expired."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"a time that is not a finite number: {value!r}")
    return float(value)
