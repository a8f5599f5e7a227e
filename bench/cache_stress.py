"""The response cache under concurrency and Redis failures: a stress run (not a test: it takes seconds per run).

P processes (separate ``ResponseCache`` objects, one real redis-server) x T threads serve overlapping keys with
random values tagged with their key digest and the engine that computed them; halfway, process 0 deploys a new
engine (``set_engine("v2")``). Optionally Redis is killed (kill -9) and restarted on the same port twice
(``--chaos``), or runs at ``--maxmemory`` with a ``--policy`` (allkeys-lru, noeviction...). Checked, per process:

- every served value is the one computed for that exact key (digest tag);
- once a process has applied v2, it never serves an answer computed by v1;
- every process ends on v2; the lookup counts add up (L1 results = requests, L2 results = L1 misses).

Prints one line per process and PASS/FAIL. Starts its own redis-server (Debian's package) on a free loopback port.

    python bench/cache_stress.py [--procs 3] [--threads 24] [--seconds 8] [--ttl 120] [--chaos]
                                 [--maxmemory 2mb --policy allkeys-lru] [--pad 0]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from trtforge.scheduler.cache.entry import CacheConfig
from trtforge.scheduler.cache.front import ResponseCache
from trtforge.scheduler.cache.keys import make_key

KEYS = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis(port: int) -> subprocess.Popen[bytes]:
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("redis-server did not start")


def _req(k: int) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": f"question number {k}"}], "temperature": 0}


def _worker(url: str, idx: int, args: argparse.Namespace, go: Any, out: Any) -> None:
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=url, namespace="stress", ttl_qa_s=args.ttl,
                      stale_grace_s=args.ttl * 2)
    cache = ResponseCache(cfg, engine_sha="v1")
    lock = threading.Lock()
    stats = {"served": 0, "computed": 0, "other_key": 0, "old_engine": 0}
    stop = time.monotonic() + 3600.0

    def compute(request: dict[str, Any]) -> dict[str, Any]:
        with lock:
            stats["computed"] += 1
        engine = cache.engine_sha  # the engine that answers
        return {"d": make_key(request).digest, "eng": engine, "r": random.random(), "pad": "p" * args.pad}

    def run(tid: int) -> None:
        rng = random.Random(idx * 1000 + tid)
        while time.monotonic() < stop:
            v2 = cache.engine_sha == "v2"
            value, got = cache.serve(_req(rng.randrange(KEYS)), compute)
            with lock:
                stats["served"] += 1
                stats["other_key"] += value["d"] != got.key.digest
                stats["old_engine"] += v2 and value["eng"] != "v2"

    go.wait()
    stop = time.monotonic() + args.seconds
    threads = [threading.Thread(target=run, args=(t,)) for t in range(args.threads)]
    for t in threads:
        t.start()
    if idx == 0:
        time.sleep(args.seconds / 2)
        cache.set_engine("v2")
    for t in threads:
        t.join()
    time.sleep(2.0)  # a pending publish, a reconnecting subscriber
    assert cache.metrics is not None
    access = cache.metrics.hot._access
    stats["l1"] = sum(n for (_, layer), n in access.items() if layer == "l1")
    stats["l2"] = sum(n for (_, layer), n in access.items() if layer == "l2")
    stats["l1_miss"] = access.get(("miss", "l1"), 0)
    out.put((idx, cache.engine_sha, stats))
    cache.close()


def _chaos(proc: subprocess.Popen[bytes], port: int, seconds: float) -> subprocess.Popen[bytes]:
    for pause, down in ((seconds / 4, 0.7), (seconds / 2, 0.3)):  # kill -9 mid-run (flushes in flight), restart
        time.sleep(pause)
        proc.kill()
        proc.wait()
        time.sleep(down)
        proc = _redis(port)
    return proc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=3)
    p.add_argument("--threads", type=int, default=24)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--ttl", type=float, default=120.0, help="Q&A TTL (grace: twice it); short TTLs stress refresh")
    p.add_argument("--chaos", action="store_true", help="kill -9 and restart Redis twice during the run")
    p.add_argument("--maxmemory", default=None, help="e.g. 2mb")
    p.add_argument("--policy", default="noeviction", help="maxmemory-policy with --maxmemory")
    p.add_argument("--pad", type=int, default=0, help="characters added to each answer")
    args = p.parse_args()
    port = _free_port()
    proc = _redis(port)
    url = f"redis://127.0.0.1:{port}/0"
    if args.maxmemory:
        import redis

        redis.Redis.from_url(url).config_set("maxmemory-policy", args.policy)
        redis.Redis.from_url(url).config_set("maxmemory", args.maxmemory)
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, i, args, go, out)) for i in range(args.procs)]
    for w in procs:
        w.start()
    time.sleep(3.0)  # imports and start-up
    go.set()
    if args.chaos:
        proc = _chaos(proc, port, args.seconds)
    results = sorted(out.get(timeout=args.seconds + 120) for _ in procs)
    for w in procs:
        w.join()
    proc.kill()
    ok = True
    for idx, engine, s in results:
        good = (engine == "v2" and not s["other_key"] and not s["old_engine"] and s["l1"] == s["served"]
                and s["l2"] == s["l1_miss"])
        ok &= good
        print(f"process {idx}: engine {engine} {s} {'ok' if good else 'FAIL'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
