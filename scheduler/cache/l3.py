"""L3: a semantic tier: FAISS inner-product search over normalised prompt embeddings, one index per scope.

A lookup embeds the request's normalised final user message and serves the nearest entry of the *same scope*
(model, adapter, conversation, task: a semantic hit never crosses them) whose cosine similarity is at least
``l3_threshold``, written under the current version and still fresh. The embedding is pluggable (any
``Callable[[str], np.ndarray]`` of vectors of ``l3_dim``, normalised here when they are not unit vectors); the
default, ``ngram_embedding``, is dependency-free character 3- and 4-gram hashing, which catches near-duplicates
(typos, punctuation, word order changes nearby) but not paraphrases with other words; plug a sentence encoder for
those.

A candidate whose numbers (digit runs with their sign, English number words and ordinals, Roman numerals, and the
symbols comparing or combining numbers: ``<`` ``>`` ``=`` and ``+ - * / ^ %`` between digits; in order) differ from
the query's is never served, however similar: texts differing only in an id, an amount, a date, a count, a sign
("-20 degrees"), a comparison ("> 100") or an operation are near-duplicates to an n-gram embedding (customer 1043 and
1044: 0.95) but not the same question. Likewise a candidate whose negations differ (``not``,
``no``, ``never``, ``without``, ``n't``..., in order): "drinks with alcohol" and "drinks without alcohol" are 0.9
apart by n-grams and opposite questions; a word negated by an affix ("safe" / "unsafe", "legal" / "illegal",
"harmful" / "harmless"); and the guarded words (``GUARDED_WORDS``: opposites such as maximum / minimum, plus / minus,
ascending / descending, and units such as mg / g, Celsius / Fahrenheit, in order, so "Celsius to Fahrenheit" is not
"Fahrenheit to Celsius"). What no word list catches stays a near-duplicate to n-grams and is served: another proper
noun one letter away ("Austria" / "Australia") or another word that is no typo; with the default embedding, turn L3
on only where such a pair shares its answer, or plug an embedding that tells them apart. Similarities are float32
inner products: one within ``SIM_TOLERANCE`` (1e-5) below the threshold reaches it, so an identical text always
reaches a threshold of 1.0. An embedding of another size than ``l3_dim`` (or with a non-finite value) is an
InputError naming ``l3_dim``, first checked when the tier is created. One entry per digest: a re-stored (refreshed)
answer replaces the old one. Expired entries are
swept out of the index as entries are added (amortised: after max(1024, half the entries) adds) and every other
version's on an invalidation; the HNSW index, which cannot remove vectors, is rebuilt from the vectors kept.

The index and its version live beside the cache: ``save(folder)`` writes ``l3.json`` atomically (a kill -9 leaves
the old file or the new one), ``load(folder)`` adds its entries and takes its version, all or nothing: a file that is
not one ``save`` writes (truncated, corrupt, edited into other types, another ``format``) is an InputError naming it
and what to do, and nothing of it is loaded. Vectors are not saved: the texts are embedded again by this tier's
embedding, so a file saved under another ``l3_dim`` (its ``dim``, informational) loads into this one.
``rebuild()`` (new embedding, new threshold) bumps the version, which the front publishes as an invalidation.
"""

from __future__ import annotations

import base64
import json
import math
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.build_engine.core.errors import InputError

from .entry import CacheConfig, Entry
from .l3_guard import same_question

# float32 inner products of unit vectors are off by up to ~3e-6 at 256 dimensions (an identical text measured
# 0.9999973): a similarity this far below the threshold still reaches it.
SIM_TOLERANCE = 1e-5

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


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    """``vectors`` (rows) as float32 with every non-zero row of another length than 1 (beyond float32 rounding)
    scaled to length 1; unit rows are kept bit for bit."""
    vecs = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vecs.reshape(len(vecs), -1), axis=1)
    off = (norms > 0) & (np.abs(norms - 1.0) > 1e-4)
    if off.any():
        vecs = vecs.copy()
        vecs[off] /= norms[off, None]
    return vecs


def faiss_ids(index: Any) -> list[int]:
    """The ids an ``IndexIDMap2`` holds, in insertion order."""
    import faiss

    return faiss.vector_to_array(index.id_map).tolist()  # type: ignore[no-any-return]


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
        self._ids: dict[str, int] = {}  # digest -> the id of its one entry (a re-stored answer replaces the old one)
        self._next = 0
        self._adds = 0  # since the last sweep of expired entries
        self._vector("a probe text")  # a wrong embedding size is an InputError here, not a FAISS assert per request

    def _vector(self, text: str, vector: np.ndarray | None = None) -> np.ndarray:
        vec = np.asarray(self.embed(text) if vector is None else vector, dtype=np.float32).reshape(1, -1)
        if vec.shape[1] != self.cfg.l3_dim:
            raise InputError(f"L3 embedding gives {vec.shape[1]} values per text but l3_dim is {self.cfg.l3_dim}; "
                             "set CacheConfig.l3_dim to the embedding's dimension")
        if not np.isfinite(vec).all():
            raise InputError(f"L3 embedding gave a non-finite value for the text {text[:40]!r}; fix the embedding")
        # Inner products are cosines only of unit vectors: an encoder that does not normalise (sentence-transformers'
        # default) scored unrelated texts 2.2 against a threshold of 0.9, and served their answers.
        return _unit_rows(vec)

    def _new_index(self) -> Any:
        import faiss

        base = (faiss.IndexHNSWFlat(self.cfg.l3_dim, 32, faiss.METRIC_INNER_PRODUCT) if self.cfg.l3_index == "hnsw"
                else faiss.IndexFlatIP(self.cfg.l3_dim))
        return faiss.IndexIDMap2(base)

    def _remove(self, scope: str, ids: list[int]) -> None:
        """Drop ``ids`` (of ``scope``) from its index and the entries (lock held). HNSW cannot remove vectors: its
        index is rebuilt from the vectors kept."""
        index = self._index[scope]
        if self.cfg.l3_index == "hnsw":
            gone = set(ids)
            keep = np.array([i for i in faiss_ids(index) if i not in gone], dtype=np.int64)
            fresh = self._new_index()
            if len(keep):
                fresh.add_with_ids(index.reconstruct_batch(keep), keep)
            index = self._index[scope] = fresh
        else:
            index.remove_ids(np.array(ids, dtype=np.int64))
        for i in ids:
            e = self._entries.pop(i)
            if self._ids.get(e.digest) == i:
                del self._ids[e.digest]
        if index.ntotal == 0:
            del self._index[scope]

    def add(self, entry: Entry, vector: np.ndarray | None = None) -> None:
        vec = self._vector(entry.text, vector)
        self.add_batch([entry], vec)

    def add_batch(self, entries: list[Entry], vectors: np.ndarray) -> None:
        """Bulk insert (index rebuilds, benchmarks): one FAISS call per scope. An entry replaces an earlier one of
        its digest (a refreshed answer), so expired copies never pile up in front of the live one. Rows that are not
        unit vectors are normalised, as ``add`` does (inner products are cosines only of unit vectors)."""
        vectors = _unit_rows(vectors)
        by_scope: dict[str, list[int]] = {}
        for row, e in enumerate(entries):
            by_scope.setdefault(e.scope, []).append(row)
        with self._lock:
            for scope, rows in by_scope.items():
                old: dict[str, list[int]] = {}
                for r in rows:
                    i = self._ids.get(entries[r].digest)
                    if i is not None and i in self._entries:
                        old.setdefault(self._entries[i].scope, []).append(i)
                for old_scope, replaced in old.items():
                    self._remove(old_scope, replaced)
                index = self._index.get(scope)
                if index is None:
                    index = self._index[scope] = self._new_index()
                ids = np.arange(self._next + 1, self._next + 1 + len(rows), dtype=np.int64)
                self._next += len(rows)
                index.add_with_ids(np.ascontiguousarray(vectors[rows], dtype=np.float32), ids)
                self._entries.update(zip(ids.tolist(), (entries[r] for r in rows), strict=True))
                self._ids.update((entries[r].digest, i) for r, i in zip(rows, ids.tolist(), strict=True))
            self._adds += len(entries)
            sweep = self._adds >= max(1024, len(self._entries) // 2)
        if sweep:  # amortised O(1) per add: expired entries leave the index instead of growing it forever
            self.prune(None)

    def search(self, scope: str, text: str, version: str, now: float | None = None, k: int = 4,
               vector: np.ndarray | None = None) -> tuple[Entry, float] | None:
        """The nearest fresh entry of ``version`` in ``scope`` with similarity >= the threshold (computed in float32:
        within ``SIM_TOLERANCE`` below it counts, so an identical text always reaches a threshold of 1.0)."""
        now = time.time() if now is None else now
        if scope not in self._index:  # nothing to compare with: no embedding computed (a dict read, no lock needed)
            return None
        vec = self._vector(text, vector)
        floor = self.cfg.l3_threshold - SIM_TOLERANCE
        with self._lock:
            index = self._index.get(scope)
            while index is not None and index.ntotal > 0:
                sims, ids = index.search(vec, min(k, index.ntotal))
                for sim, i in zip(sims[0], ids[0], strict=True):
                    if sim < floor:
                        return None
                    entry = self._entries.get(int(i))
                    if (entry is not None and entry.version == version and entry.fresh(now)
                            and same_question(entry.text, text)):
                        return entry, float(sim)
                if k >= index.ntotal:
                    return None
                k *= 4  # every candidate so far was expired or of another version: look further
        return None

    def prune(self, version: str | None, now: float | None = None) -> int:
        """Drop entries past their expiry and, given a ``version``, those of other versions; returns how many."""
        now = time.time() if now is None else now
        with self._lock:
            dead: dict[str, list[int]] = {}
            for i, e in self._entries.items():
                if (version is not None and e.version != version) or not e.fresh(now):
                    dead.setdefault(e.scope, []).append(i)
            for scope, ids in dead.items():
                self._remove(scope, ids)
            self._adds = 0
        removed = sum(len(ids) for ids in dead.values())
        if removed and self.metrics is not None:
            self.metrics.eviction.labels(layer="l3").inc(removed)
        return removed

    def rebuild(self) -> int:
        """Start a new index version (after changing the embedding or threshold); returns it."""
        with self._lock:
            self._index.clear()
            self._entries.clear()
            self._ids.clear()
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
        """Add the entries of ``folder/l3.json`` (as ``save`` wrote it) and take its index version: all or nothing
        (module docstring)."""
        version, entries = _read_saved(Path(folder) / "l3.json")
        self.version = version
        for entry in entries:
            self.add(entry)


def _read_saved(path: Path) -> tuple[int, list[Entry]]:
    """The index version and entries of a saved ``l3.json``; an InputError naming it for anything ``save`` does not
    write (it was a bare JSONDecodeError, KeyError or TypeError, after part of the file was loaded; an expiry
    edited into a string loaded and made every later lookup raise TypeError; a value that is not base64 was served
    as b'')."""

    def bad(why: str) -> InputError:
        return InputError(f"{path}: {why}; delete it (the index then starts empty) or save the index again")

    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError as exc:
        raise InputError(f"{path}: no saved index there; save one first, or start without load") from exc
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror}); check the path and its permissions") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError: a truncated or corrupt file
        raise bad(f"not an L3 index, its JSON does not parse ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != 1:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise bad(f"not an L3 index of format 1 (found {found!r}: another trtforge version, or another file)")
    version, items = data.get("version"), data.get("entries")
    if type(version) is not int or version < 1 or not isinstance(items, list):
        raise bad("its index version (a whole number >= 1) or its entries (a list) are missing")
    entries = []
    for n, it in enumerate(items):
        try:
            entries.append(_saved_entry(it))
        except (KeyError, TypeError, ValueError) as exc:  # binascii.Error is a ValueError
            raise bad(f"entry {n} is malformed ({type(exc).__name__}: {exc})") from exc
    return version, entries


def _saved_entry(it: Any) -> Entry:
    digest, version, scope, text, created, expires = (it[k] for k in ("d", "ver", "s", "t", "c", "e"))
    if not all(isinstance(x, str) for x in (digest, version, scope, text)):
        raise TypeError("d, ver, s and t must be strings")
    if not all(type(x) in (int, float) and math.isfinite(x) for x in (created, expires)):
        raise TypeError("c and e must be finite numbers")
    value = base64.b64decode(it["v"], validate=True) if it.get("b") else it["v"]
    return Entry(digest=digest, value=value, created=float(created), expires=float(expires), version=version,
                 scope=scope, text=text)
