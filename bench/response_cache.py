"""The response cache's tiers, measured side by side in one run (real cachetools, a real redis-server, FAISS).

1. L1 lookup latency (full ``ResponseCache.lookup``: key normalisation + hashing + TLRU get), p50/p99 over 20,000
   lookups of 2,000 cached requests; target p99 < 100 us.
2. L2 writes: the pipelined, buffered writer (one non-transactional pipeline per flush) vs one SET round trip per
   response, on the same server; target >= 10x throughput.
3. L3 lookup (embedding + FAISS search in one scope) at 10^4, 10^5, 10^6 entries (flat inner-product index; random
   unit vectors stand in for stored prompts, the query is a real n-gram embedding).
4. With ``--trace``: simulator goodput with each tier set (see ``trtforge simulate --response-cache``).

Starts its own redis-server on a free loopback port (Debian's package); skips L2 when none is installed.

    python bench/response_cache.py [--sizes 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import time

import numpy as np

from trtforge.scheduler.cache.entry import CacheConfig, Entry
from trtforge.scheduler.cache.front import ResponseCache
from trtforge.scheduler.cache.keys import make_key


def _req(i: int) -> dict:
    return {"model": "llama-8b", "adapter": "support", "temperature": 0, "max_tokens": 128,
            "messages": [{"role": "system", "content": "You answer billing questions."},
                         {"role": "user",
                          "content": f"Question {i}: why was invoice {i * 7919 % 100000} charged twice?"}]}


def bench_l1() -> None:
    cache = ResponseCache(CacheConfig(l1_entries=10_000), metrics=False)
    reqs = [_req(i) for i in range(2000)]
    for r in reqs:
        cache.store(make_key(r), {"text": "answer"})
    lat = []
    for k in range(20_000):
        r = reqs[k % len(reqs)]
        t0 = time.perf_counter()
        hit = cache.lookup(r)
        lat.append(time.perf_counter() - t0)
        assert hit.layer == "l1"
    lat.sort()
    p50, p99 = lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6
    print(f"L1 lookup (key + get): p50 {p50:.1f} us, p99 {p99:.1f} us  (target p99 < 100 us: "
          f"{'PASS' if p99 < 100 else 'MISS'})")


def _redis() -> tuple[subprocess.Popen[bytes], str] | None:
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def bench_l2(n: int = 5000) -> None:
    server = _redis()
    if server is None:
        print("L2: skipped (redis-server not installed)")
        return
    proc, url = server
    try:
        cfg = CacheConfig(layers=("l1", "l2"), redis_url=url, namespace="bench", flush_entries=256,
                          buffer_max=100_000)
        cache = ResponseCache(cfg, engine_sha="e", metrics=False)
        keys = [make_key(_req(i)) for i in range(n)]
        now = time.time()
        entries = [Entry(k.digest, {"text": "answer " * 20}, now, now + 120, cache.version) for k in keys]
        t0 = time.perf_counter()
        for e in entries:
            cache.l2.put(cache.version, e, now)
        cache.l2.flush()
        piped = time.perf_counter() - t0
        client = cache.l2.client
        t0 = time.perf_counter()
        for e in entries:
            client.set(f"bench:single:{e.digest}", e.to_bytes(), px=120_000)
        single = time.perf_counter() - t0
        assert client.dbsize() >= 2 * n
        ratio = single / piped
        print(f"L2 writes, {n} responses: pipelined {n / piped:,.0f}/s vs one round trip each {n / single:,.0f}/s: "
              f"x{ratio:.1f} (target >= 10x: {'PASS' if ratio >= 10 else 'MISS'}); {cache.l2.flushes} pipelines")
        t0 = time.perf_counter()
        for k in keys[:2000]:
            client.get(cache.l2.name(cache.version, k.digest))
        print(f"L2 lookup (one GET round trip, loopback): {(time.perf_counter() - t0) / 2000 * 1e6:.0f} us mean")
        cache.close()
    finally:
        proc.kill()


def bench_l3(sizes: list[int], dim: int = 256) -> None:
    from trtforge.scheduler.cache.l3 import L3

    rng = np.random.default_rng(0)
    for n in sizes:
        l3 = L3(CacheConfig(layers=("l1", "l3"), l3_dim=dim))
        vecs = rng.standard_normal((n, dim), dtype=np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        entries = [Entry(str(i), None, 0.0, 1e18, "v", scope="s") for i in range(n)]
        t0 = time.perf_counter()
        l3.add_batch(entries, vecs)
        build = time.perf_counter() - t0
        lat = []
        for i in range(50):
            t0 = time.perf_counter()
            l3.search("s", f"question {i} about invoices", "v", now=0.0)
            lat.append(time.perf_counter() - t0)
        print(f"L3 lookup at {n:>9,} entries: median {statistics.median(lat) * 1e3:.2f} ms, "
              f"max {max(lat) * 1e3:.2f} ms (flat index; built in {build:.1f} s)")
        del l3, vecs, entries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000")
    args = ap.parse_args()
    bench_l1()
    bench_l2()
    bench_l3([int(s) for s in args.sizes.split(",")])


if __name__ == "__main__":
    main()
