"""Cache invalidation across replicas over Redis pub/sub.

A new engine (its manifest's sha256 changes) or a rebuilt semantic index changes the cache version. The replica that
makes the change publishes ``{"engine": sha, "index": n, "origin": id}`` on ``<namespace>:invalidate`` and stores it
under ``<namespace>:version``; every replica's subscriber thread applies it (drops L1, prunes L3, and from then on
reads and writes only keys of the new version: entries of the old version are never served). A replica that starts
later adopts the stored version (at start-up, or when it first reaches Redis if Redis was down then). The subscriber
survives Redis outages (it reconnects every second) and, once back, applies the stored version if it changed
meanwhile (a publish it could not hear).

Under failure (each case was a replica serving another engine's answers, or a version lost for good):

- "Changed meanwhile" is against the stored version this replica last saw (at start-up, or at first contact when
  Redis was down then), not against nothing: a replica started with its own engine sha did not adopt the older
  stored version at start-up, and must not adopt it either when its subscriber reconnects (it did, and then read and
  wrote the old engine's keys).
- A publish Redis could not take (an outage, OOM) is kept *pending* and sent as soon as Redis takes it again
  (the subscriber retries at once after reconnecting, then every ``KEEP_S``), and a pending local deploy is never
  undone by a catch-up to the older stored version (it was: Redis restarted from its snapshot, and the replica
  that deployed went back to the old engine's version, while the others never heard of the new one). A publish
  heard from another replica meanwhile supersedes it. Two replicas deploying different engines during one
  partition: the last to reach Redis wins.
- The version key comes back by itself: every ``KEEP_S`` a replica that holds a version writes it again if the key
  is gone (``SET NX``: FLUSHALL, an eviction under ``allkeys-lru`` where this rarely read key goes first, a restart
  without persistence), and a replica without a version (``engine_sha="none"``) keeps looking for one to adopt.
- Concurrent deploys converge on the last message, which the key holds (``send``, ``_handle``). At maxmemory the
  live replicas hear a deploy at once by a bare PUBLISH; the key (for replicas started later) follows when the
  pending publish goes through.
- A catch-up read that fails on an outage (no pooled connection free, a timeout, LOADING) is tried again at the next
  reconnect, not taken for "nothing stored" (the missed invalidation was lost for good).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

KEEP_S = 5.0  # how often the subscriber sends a pending publish, restores a lost version key, or looks for one


class Invalidation:
    def __init__(self, client: Any, namespace: str, apply: Callable[[str, int], None], adopt: bool = False) -> None:
        self.client = client
        # adopt: this replica has no version of its own (``engine_sha="none"``): the first time the subscriber
        # reaches Redis it applies the stored version (a replica started during an outage used to keep "none").
        self.adopt = adopt
        self.channel = f"{namespace}:invalidate"
        self.version_key = f"{namespace}:version"
        self.origin = uuid.uuid4().hex
        self.apply = apply
        self.received = 0
        # The stored version this replica last saw, published or applied (None: none seen yet): a catch-up applies
        # only a change from it. Read before the subscriber starts (the front adopts it when it has no version).
        self.last: tuple[str, int] | None = self.stored()
        self.pending: tuple[str, int] | None = None  # published here while Redis could not take it
        self._closed = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="trtforge-cache-invalidate", daemon=True)
        self._thread.start()
        self._ready.wait(2.0)

    def stored(self, raising: bool = False) -> tuple[str, int] | None:
        """The stored version; None when there is none, it is foreign, or (unless ``raising``) Redis fails the read.
        The subscriber's catch-up raises on an outage (no pooled connection free, a timeout, Redis still loading its
        data after a restart): a read that failed is not "nothing stored", it is tried again (a missed invalidation
        was lost for good). A refused command (e.g. WRONGTYPE) is a foreign value."""
        from redis import ConnectionError as Outage  # BusyLoadingError is a ConnectionError
        from redis import TimeoutError as Slow

        try:
            raw = self.client.get(self.version_key)
        except Exception as exc:  # Redis down or refusing: keep the local version
            if raising and isinstance(exc, Outage | Slow | OSError):
                raise
            return None
        try:
            if raw is None:
                return None
            d = json.loads(raw)
            return str(d["engine"]), int(d["index"])
        except (ValueError, KeyError, TypeError):  # a foreign value: keep the local version
            return None

    def _message(self, engine: str, index: int) -> str:
        return json.dumps({"engine": engine, "index": index, "origin": self.origin})

    def send(self, engine: str, index: int) -> None:
        """Store and publish the version in one MULTI/EXEC, so the key always holds the last version published (two
        pipelines could interleave: SET a, SET b, PUBLISH b, PUBLISH a); raises the Redis error when it cannot (the
        CLI names it)."""
        msg = self._message(engine, index)
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.version_key, msg)
        pipe.publish(self.channel, msg)
        pipe.execute()

    def publish(self, engine: str, index: int) -> bool:
        self.last = (engine, index)
        try:
            self.send(engine, index)
        except Exception as exc:  # the local replica applied it; it is sent once Redis takes it again
            self.pending = (engine, index)
            self._tell_live(engine, index)
            log.warning("response cache: could not publish the invalidation (%s); it is sent when Redis is back",
                        type(exc).__name__)
            return False
        self.pending = None
        return True

    def _tell_live(self, engine: str, index: int) -> None:
        """A refused MULTI (the SET at maxmemory): the live replicas still hear the version by a bare PUBLISH, which
        Redis takes out of memory too (they kept serving the old engine's L1 answers for as long as Redis was full);
        the key follows when the pending publish goes through."""
        try:
            self.client.publish(self.channel, self._message(engine, index))
        except Exception as exc:  # an outage: nobody hears anything now; the pending publish tells them later
            log.debug("response cache: no bare publish either (%s)", type(exc).__name__)

    def _send_pending(self) -> None:
        pending = self.pending
        if pending is None:
            return
        self.send(*pending)  # raises while Redis cannot take it: still pending
        if self.pending == pending:
            self.pending = None
        log.warning("response cache: published the invalidation to %s.%d that Redis could not take before",
                    pending[0][:16], pending[1])

    def _listen(self) -> None:
        subscribed_before = False
        while not self._closed.is_set():
            try:
                ps = self.client.pubsub()
                ps.subscribe(self.channel)
                # Ready only once the server confirmed the subscription: a publish before that would be lost.
                while not self._closed.is_set():
                    first = ps.get_message(timeout=0.2)
                    if first is not None and first.get("type") == "subscribe":
                        break
                if self.pending is not None:  # this replica's own deploy is newer than anything stored
                    self._send_pending()
                elif subscribed_before or (self.adopt and self.last is None):
                    self._catch_up()  # back after an outage (or first contact): the version key has what was missed
                elif self.last is None:  # first contact of a replica with its own version: remember, do not apply
                    self.last = self.stored(raising=True)
                subscribed_before = True
                self._ready.set()
                keep = time.monotonic() + KEEP_S
                while not self._closed.is_set():
                    msg = ps.get_message(timeout=0.2)
                    if msg is not None and msg.get("type") == "message":
                        self._handle(msg["data"])
                    if time.monotonic() >= keep:
                        self._keep()
                        keep = time.monotonic() + KEEP_S
                ps.close()
            except Exception:
                self._ready.set()
                self._closed.wait(1.0)

    def _keep(self) -> None:
        """Every ``KEEP_S``: send a pending publish; restore the version key when it is gone; adopt one if none."""
        try:
            if self.pending is not None:
                self._send_pending()
            elif self.last is not None:
                self.client.set(self.version_key, self._message(*self.last), nx=True)
            elif self.adopt:
                self._catch_up()
        except Exception as exc:  # an outage: the subscriber's own connection notices it; a refusal: next time
            log.debug("response cache: version upkeep failed (%s)", type(exc).__name__)

    def _catch_up(self) -> None:
        got = self.stored(raising=True)  # a failed read: the subscriber reconnects and catches up again
        if got is not None and got != self.last:
            self.last = got
            self.apply(*got)
            self.received += 1

    def _handle(self, data: bytes) -> None:
        """Every replica hears the messages in one order and ends on the last one: its own message too is applied
        when another was applied since it was published (ignoring it, two replicas deploying at once each applied
        the other's message and kept the swapped versions for good)."""
        try:
            d = json.loads(data)
            heard = (str(d["engine"]), int(d["index"]))
        except (ValueError, KeyError, TypeError):
            log.warning("response cache: ignored a malformed invalidation message")
            return
        own = d.get("origin") == self.origin
        if own and heard == self.last:
            return
        if not own:
            self.pending = None  # another replica's publish, heard after ours failed, supersedes it
        self.last = heard
        self.apply(*heard)
        self.received += 1  # after applying: a caller that sees the count sees the new version

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2)
