"""L3: a semantic tier: FAISS inner-product search over normalised prompt embeddings, one index per scope.

A lookup embeds the request's normalised final user message and serves the nearest entry of the *same scope*
(model, adapter, conversation, task: a semantic hit never crosses them) whose cosine similarity is at least
``l3_threshold``, written under the current version and still fresh. The embedding is pluggable (any
``Callable[[str], np.ndarray]`` of unit vectors of ``l3_dim``); the default, ``ngram_embedding``, is dependency-free
character 3- and 4-gram hashing, which catches near-duplicates (typos, punctuation, word order changes nearby) but
not paraphrases with other words; plug a sentence encoder for those.

The index and its version live beside the cache: ``save(folder)``/``load(folder)`` write ``l3.json`` atomically;
``rebuild()`` (new embedding, new threshold) bumps the version, which the front publishes as an invalidation.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .entry import CacheConfig, Entry

Embedding = Callable[[str], np.ndarray]


def ngram_embedding(dim: int = 256) -> Embedding:
    """Character 3/4-gram feature hashing into ``dim`` signed buckets, L2-normalised (crc32: stable across runs)."""

    def embed(text: str) -> np.ndarray:
        vec = np.zeros(dim, dtype=np.float32)
        padded = f"  {text.lower()}  "
        for n in (3, 4):
            for i in range(len(padded) - n + 1):
                h = zlib.crc32(padded[i:i + n].encode())
                vec[h % dim] += 1.0 if (h >> 31) & 1 else -1.0
        norm = float(np.linalg.norm(vec))
        return vec / norm if norm > 0 else vec

    return embed


class L3:
    def __init__(self, cfg: CacheConfig, embed: Embedding | None = None, metrics: Any = None) -> None:
        import faiss  # fail early, at creation, when faiss-cpu is missing

        # One query at a time is the request path's shape: OpenMP threads only add wake-up latency there (measured:
        # 60 ms -> 24 ms at 10^5 entries on a busy 2-core machine).
        faiss.omp_set_num_threads(1)

        self.cfg = cfg
        self.embed = embed or ngram_embedding(cfg.l3_dim)
        self.metrics = metrics
        self.version = 1
        self._lock = threading.Lock()
        self._index: dict[str, Any] = {}
        self._entries: dict[int, Entry] = {}
        self._next = 0

    def _new_index(self) -> Any:
        import faiss

        base = (faiss.IndexHNSWFlat(self.cfg.l3_dim, 32, faiss.METRIC_INNER_PRODUCT) if self.cfg.l3_index == "hnsw"
                else faiss.IndexFlatIP(self.cfg.l3_dim))
        return faiss.IndexIDMap2(base)

    def add(self, entry: Entry, vector: np.ndarray | None = None) -> None:
        vec = (self.embed(entry.text) if vector is None else vector).astype(np.float32).reshape(1, -1)
        with self._lock:
            index = self._index.get(entry.scope)
            if index is None:
                index = self._index[entry.scope] = self._new_index()
            self._next += 1
            index.add_with_ids(vec, np.array([self._next], dtype=np.int64))
            self._entries[self._next] = entry

    def add_batch(self, entries: list[Entry], vectors: np.ndarray) -> None:
        """Bulk insert (index rebuilds, benchmarks): one FAISS call per scope."""
        by_scope: dict[str, list[int]] = {}
        for row, e in enumerate(entries):
            by_scope.setdefault(e.scope, []).append(row)
        with self._lock:
            for scope, rows in by_scope.items():
                index = self._index.get(scope)
                if index is None:
                    index = self._index[scope] = self._new_index()
                ids = np.arange(self._next + 1, self._next + 1 + len(rows), dtype=np.int64)
                self._next += len(rows)
                index.add_with_ids(np.ascontiguousarray(vectors[rows], dtype=np.float32), ids)
                self._entries.update(zip(ids.tolist(), (entries[r] for r in rows), strict=True))

    def search(self, scope: str, text: str, version: str, now: float | None = None, k: int = 4,
               vector: np.ndarray | None = None) -> tuple[Entry, float] | None:
        now = time.time() if now is None else now
        with self._lock:
            index = self._index.get(scope)
            if index is None or index.ntotal == 0:
                return None
            vec = (self.embed(text) if vector is None else vector).astype(np.float32).reshape(1, -1)
            sims, ids = index.search(vec, min(k, index.ntotal))
            for sim, i in zip(sims[0], ids[0], strict=True):
                entry = self._entries.get(int(i))
                if entry is None or sim < self.cfg.l3_threshold:
                    continue
                if entry.version == version and entry.fresh(now):
                    return entry, float(sim)
        return None

    def prune(self, version: str, now: float | None = None) -> int:
        """Drop entries of other versions and past their expiry; returns how many."""
        now = time.time() if now is None else now
        removed = 0
        with self._lock:
            for scope, index in list(self._index.items()):
                dead = [i for i, e in self._entries.items() if e.scope == scope and
                        (e.version != version or not e.fresh(now))]
                if dead:
                    index.remove_ids(np.array(dead, dtype=np.int64))
                    for i in dead:
                        del self._entries[i]
                    removed += len(dead)
                if index.ntotal == 0:
                    del self._index[scope]
        if removed and self.metrics is not None:
            self.metrics.eviction.labels(layer="l3").inc(removed)
        return removed

    def rebuild(self) -> int:
        """Start a new index version (after changing the embedding or threshold); returns it."""
        with self._lock:
            self._index.clear()
            self._entries.clear()
            self.version += 1
            return self.version

    def __len__(self) -> int:
        return len(self._entries)

    def save(self, folder: str | Path) -> None:
        from trtforge.build_engine.core import fsutil

        with self._lock:
            entries = list(self._entries.values())
        items = []
        for e in entries:
            try:  # the stored form of L2: a value that would not read back equal is left out (it was a TypeError)
                d = json.loads(e.to_bytes().partition(b"|")[2])
            except ValueError:
                continue
            items.append({k: d[k] for k in ("d", "v", "c", "e", "ver", "s", "t", "b") if k in d})
        fsutil.write_json(Path(folder) / "l3.json", {"format": 1, "version": self.version, "dim": self.cfg.l3_dim,
                                                     "entries": items})

    def load(self, folder: str | Path) -> None:
        data = json.loads((Path(folder) / "l3.json").read_text())
        self.version = int(data["version"])
        for it in data["entries"]:
            value = base64.b64decode(it["v"]) if it.get("b") else it["v"]
            self.add(Entry(digest=it["d"], value=value, created=it["c"], expires=it["e"], version=it["ver"],
                           scope=it["s"], text=it["t"]))
