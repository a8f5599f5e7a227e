"""A real redis-server (Debian's package) on a free loopback port, started per test session (and per test where a
test kills it). `.ci/run` installs redis-server when it is missing; locally a missing server skips these tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass
class RedisServer:
    proc: subprocess.Popen[bytes]
    port: int
    extra: tuple[str, ...] = ()  # more redis-server options (e.g. --appendonly yes --dir D: data kept over a restart)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        """The server comes back on the same port after a ``stop`` (empty, unless ``extra`` keeps its data)."""
        self.proc = start_redis(self.port, *self.extra).proc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(port: int | None = None, *extra: str) -> RedisServer:
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed; .ci/run installs it (apt-get install redis-server)")
        pytest.skip("redis-server not installed (apt-get install redis-server)")
    port = _free_port() if port is None else port
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--protected-mode", "yes", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return RedisServer(proc, port, extra)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start within 10 s")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture()
def own_redis() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()
