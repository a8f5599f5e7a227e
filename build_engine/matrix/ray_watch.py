"""Losing the Ray cluster mid-run: the head's death is noticed by the driver, which then reports what it has.

Ray's core worker, on its own, waits ``gcs_rpc_server_reconnect_timeout_s`` (60 s) for a head that went away and
then ends the whole driver process from C++ ("Failed to connect to GCS within 60 seconds ... The program will
terminate": exit 1, no table, no ``matrix.json``, the finished cells unreported). So the driver raises that limit
for itself (``reconnect_timeout``, unless the user set it) and watches the head: while it waits for a result it asks
every ``POLL_S`` whether the head's GCS port still accepts a connection, and after the head has not answered for
``TRTFORGE_RAY_HEAD_GRACE_S`` seconds (default 10; a head restarted by GCS fault tolerance within that time is
not lost) it raises ``ClusterLost``. The driver then marks every unfinished cell failed with that reason, keeps
the finished ones, and writes its table and ``matrix.json`` as for any failed cell (exit 1).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from ..core import env

POLL_S = 1.0
#: What the driver allows Ray's own reconnect wait (seconds): longer than any grace, so the watch decides first.
RAY_RECONNECT_S = "86400"


class ClusterLost(RuntimeError):
    """The Ray cluster went away during the run (its head stopped answering, or Ray itself failed)."""


def reconnect_timeout() -> str:
    """``RAY_gcs_rpc_server_reconnect_timeout_s`` for the driver's ``ray.init``: the user's value, else a day."""
    return env.get(env.RAY_RECONNECT) or RAY_RECONNECT_S


class HeadWatch:
    """Whether the head (its GCS ``host:port``) still answers; ``check`` raises ``ClusterLost`` after the grace."""

    def __init__(self, gcs_address: str | None) -> None:
        self.gcs = gcs_address
        self.grace = env.get_int(env.RAY_HEAD_GRACE_S)
        self.silent_since: float | None = None

    @classmethod
    def of_connected(cls) -> HeadWatch:
        import ray

        try:
            gcs = str(ray.get_runtime_context().gcs_address)
        except Exception:  # a Ray client (ray://) connection has none here: its own errors end the wait
            gcs = None
        return cls(gcs)

    def answers(self) -> bool:
        if not self.gcs:
            return True
        host, _, port = self.gcs.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return True
        except (OSError, ValueError):
            return False

    def check(self) -> None:
        if self.answers():
            self.silent_since = None
            return
        now = time.monotonic()
        if self.silent_since is None:
            self.silent_since = now
        if now - self.silent_since >= self.grace:
            raise ClusterLost(f"not finished: the Ray head at {self.gcs} stopped answering for {self.grace} s; "
                              "restart the cluster and run build-matrix again (finished cells are cached)")


def wait_one(refs: list[Any], watch: HeadWatch) -> list[Any]:
    """``ray.wait`` for one result, asking the watch between polls."""
    import ray

    while True:
        done, _ = ray.wait(refs, num_returns=1, timeout=POLL_S)
        if done:
            return list(done)
        watch.check()
