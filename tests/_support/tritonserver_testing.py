"""The real tritonserver (CPU build 2.51, bundled in the ``nvidia-pytriton`` wheel) for tests.

``nvidia-pytriton`` pins numpy<2, which trtforge cannot use, so it is installed without its dependencies
(``pip install --no-deps nvidia-pytriton``, as the README's test command and ``.ci/run`` do): only its
``pytriton/tritonserver`` folder (the server binary, its backends folder) and ``nvidia_pytriton.libs`` (the
libraries the binary links, found through its RPATH) are used; no pytriton Python code is imported.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def server_dir() -> Path | None:
    """``.../site-packages/pytriton/tritonserver`` if the wheel is installed and its binary is there."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    return root if (root / "bin" / "tritonserver").is_file() else None


SKIP_REASON = ("the nvidia-pytriton wheel (which bundles tritonserver 2.51) is not installed: "
               "pip install --no-deps nvidia-pytriton")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@dataclass
class ServerRun:
    """One server run over a repository: its log and ``v2/repository/index`` (name -> state, reason)."""

    log: str
    index: dict[str, dict[str, str]]
    alive: bool  # still running when the index was read (False: it exited, e.g. on a bad repository)

    def reason(self, name: str) -> str:
        return self.index.get(name, {}).get("reason", "")


def _index(port: int) -> dict[str, dict[str, str]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        rows = json.loads(resp.read())
    return {r["name"]: {k: str(v) for k, v in r.items()} for r in rows}


def _ready(proc: subprocess.Popen[bytes], port: int, deadline: float) -> dict[str, dict[str, str]] | None:
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError, ValueError):
            index = _index(port)
            # Loading is synchronous at start-up (MODE_NONE): once HTTP answers, every model has its final state.
            return index
        time.sleep(0.2)
    return None


def run_server(repo: Path, log_path: Path, *, exit_on_error: bool = False, timeout: float = 60) -> ServerRun:
    """Start tritonserver on free ports over ``repo``, read the repository index, stop it."""
    root = server_dir()
    assert root is not None, SKIP_REASON
    http, grpc, metrics = _free_ports(3)
    cmd = [str(root / "bin" / "tritonserver"), f"--model-repository={repo}",
           f"--exit-on-error={'true' if exit_on_error else 'false'}", "--disable-auto-complete-config",
           f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--allow-metrics=false",
           f"--backend-directory={root / 'backends'}", f"--cache-directory={root / 'caches'}", "--log-verbose=0"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            index = _ready(proc, http, time.monotonic() + timeout)
            alive = proc.poll() is None
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return ServerRun(log_path.read_text(errors="replace"), index or {}, alive and index is not None)

