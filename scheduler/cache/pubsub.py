"""Cache invalidation across replicas over Redis pub/sub.

A new engine (its manifest's sha256 changes) or a rebuilt semantic index changes the cache version. The replica that
makes the change publishes ``{"engine": sha, "index": n, "origin": id}`` on ``<namespace>:invalidate`` and stores it
under ``<namespace>:version``; every replica's subscriber thread applies it (drops L1, prunes L3, and from then on
reads and writes only keys of the new version: entries of the old version are never served). A replica that starts
later adopts the stored version (at start-up, or when it first reaches Redis if Redis was down then). The subscriber
survives Redis outages (it reconnects every second) and, once back, applies the stored version if it changed
meanwhile (a publish it could not hear).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


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
        self.last: tuple[str, int] | None = None  # the version this replica last published or applied from others
        self._closed = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="trtforge-cache-invalidate", daemon=True)
        self._thread.start()
        self._ready.wait(2.0)

    def stored(self) -> tuple[str, int] | None:
        try:
            raw = self.client.get(self.version_key)
            if raw is None:
                return None
            d = json.loads(raw)
            return str(d["engine"]), int(d["index"])
        except Exception:  # Redis down or a foreign value: keep the local version
            return None

    def publish(self, engine: str, index: int) -> bool:
        msg = json.dumps({"engine": engine, "index": index, "origin": self.origin})
        self.last = (engine, index)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.set(self.version_key, msg)
            pipe.publish(self.channel, msg)
            pipe.execute()
            return True
        except Exception as exc:  # an outage: the local replica applied it; others adopt it from the key later
            log.warning("response cache: could not publish the invalidation (%s)", type(exc).__name__)
            return False

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
                if subscribed_before or (self.adopt and self.last is None):
                    self._catch_up()  # back after an outage (or first contact): the version key has what was missed
                subscribed_before = True
                self._ready.set()
                while not self._closed.is_set():
                    msg = ps.get_message(timeout=0.2)
                    if msg is not None and msg.get("type") == "message":
                        self._handle(msg["data"])
                ps.close()
            except Exception:
                self._ready.set()
                self._closed.wait(1.0)

    def _catch_up(self) -> None:
        got = self.stored()
        if got is not None and got != self.last:
            self.last = got
            self.apply(*got)
            self.received += 1

    def _handle(self, data: bytes) -> None:
        try:
            d = json.loads(data)
            if d.get("origin") == self.origin:
                return
            self.last = (str(d["engine"]), int(d["index"]))
            self.apply(*self.last)
            self.received += 1  # after applying: a caller that sees the count sees the new version
        except (ValueError, KeyError, TypeError):
            log.warning("response cache: ignored a malformed invalidation message")

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2)
