"""Prefix cache: full prompt blocks keyed by chained hashes, shared by reference count (vLLM v1's idea).

A block's key is ``hash((parent_key, content))`` (the first parent is the request's adapter and cache salt)
where content is the block's token ids or, for traces, the trace's block hash ids that cover it
(``block_keys``). Equal keys therefore mean equal tokens *and* equal prefix.

Safety conditions:
- a block is registered only after its tokens were computed (the scheduler calls ``register`` after prefill);
- a cached block whose last user finished stays cached-free (reusable on a hit) until space is needed; those are
  reclaimed least-recently-freed first (LRU), and a block with a user is never reclaimed: only blocks whose
  reference count is 0 sit in the LRU;
- ``available`` (free + cached-free) is the true allocatable capacity;
- a preempted request's computed full blocks stay cached-free under keys only it can find (``keep_own_blocks``),
  so its recompute reuses what eviction left of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice

from .block_pool import BlockPool, BlockPoolError
from .request import Request, Seq


def num_block_keys(request: Request, tokens_per_block: int) -> int:
    """``len(block_keys(request, tokens_per_block))``, without hashing."""
    if not request.block_hashes:
        return 0
    return min(request.prompt_tokens, len(request.block_hashes) * request.hash_block_tokens) // tokens_per_block


def block_keys(request: Request, tokens_per_block: int) -> tuple[int, ...]:
    """Chained keys of the request's full prompt blocks that its ``block_hashes`` cover completely.

    A scheduler block of ``tokens_per_block`` tokens maps onto the trace blocks of ``hash_block_tokens`` tokens
    that overlap it; the key names those trace ids and the block's offset, chained on the parent key.
    """
    hashes = request.block_hashes
    if not hashes:
        return ()
    hb = request.hash_block_tokens
    covered = min(request.prompt_tokens, len(hashes) * hb)
    keys: list[int] = []
    # vLLM's ``extra_keys``: the adapter and the salt seed the chain, so KV computed under one adapter (or salt)
    # is never found by a request under another one or by the base model; equal (adapter, salt) share as before
    parent = 0 if request.adapter is None and request.cache_salt is None else hash(
        ("extra", request.adapter, request.cache_salt))
    if hb % tokens_per_block == 0:  # each scheduler block lies inside one trace block (512 / 64): no slicing
        # the same keys as hash((parent, hashes[i // per], (i % per) * tpb)) for block i, without the index
        # arithmetic per block (a Mooncake replay hashes ~2M blocks)
        offsets = range(0, hb, tokens_per_block)
        whole, rest = divmod(covered // tokens_per_block, hb // tokens_per_block)
        append = keys.append
        for h in hashes[:whole]:
            for off in offsets:
                parent = hash((parent, h, off))
                append(parent)
        if rest:
            h = hashes[whole]
            for off in offsets[:rest]:
                parent = hash((parent, h, off))
                append(parent)
        return tuple(keys)
    for i in range(covered // tokens_per_block):
        start, end = i * tokens_per_block, (i + 1) * tokens_per_block
        ids = tuple(hashes[start // hb:(end - 1) // hb + 1])
        parent = hash((parent, ids, start % hb))
        keys.append(parent)
    return tuple(keys)


def seq_keys(seq: Seq, tokens_per_block: int) -> tuple[int, ...]:
    """``seq``'s block keys, hashed on first use (an overloaded replay never admits most of its queue)."""
    if seq.keys is None:
        seq.keys = block_keys(seq.req, tokens_per_block)
    return seq.keys


class PrefixCache:
    """Owns the block pool's allocation policy: free blocks first, then cached-free blocks in LRU order."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self._by_key: dict[int, int] = {}
        self._key_of: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks with reference count 0
        self.queries = 0
        self.hits = 0

    @property
    def num_cached_free(self) -> int:
        return len(self._lru)

    @property
    def num_cached(self) -> int:
        return len(self._by_key)

    @property
    def available(self) -> int:
        return self.pool.num_free + len(self._lru)

    def match(self, keys: Sequence[int], limit: int | None = None) -> tuple[list[int], int]:
        """Longest cached prefix of ``keys`` (of its first ``limit``): (blocks, how many of them are cached-free).
        Does not take them."""
        n = len(keys) if limit is None else min(limit, len(keys))
        get = self._by_key.get
        first = get(keys[0]) if n else None
        if first is None:
            return [], 0  # the common case of an overloaded replay: no hit, and no slice of a long key tuple
        out = [first]
        append = out.append
        for k in keys[1:n]:
            b = get(k)
            if b is None:
                break
            append(b)
        lru = self._lru
        return out, sum(map(lru.__contains__, out)) if lru else 0

    def take_hits(self, blocks: Sequence[int], queried: int) -> None:
        """Reference matched blocks for a new user (removing cached-free ones from the LRU)."""
        self.queries += queried
        self.hits += len(blocks)
        lru_pop = self._lru.pop
        for b in blocks:
            lru_pop(b, None)  # an idle cached block becomes in use: never reclaimable while referenced
        self.pool.ref_many(blocks)

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks: from the free list, reclaiming LRU cached-free blocks when it runs short."""
        short = n - self.pool.num_free
        if short > len(self._lru):
            raise BlockPoolError(f"asked for {n} blocks with {self.available} available")
        if short <= 0:
            return self.pool.allocate(n)
        lru, by_key, key_of = self._lru, self._by_key, self._key_of
        victims = list(islice(lru, short))  # the least recently freed, oldest first
        for b in victims:
            del lru[b]
            del by_key[key_of.pop(b)]
        return self.pool.allocate(n - short) + self.pool.reuse(victims)

    def allocate_one(self) -> int:
        """``allocate(1)[0]`` (max-utilization and vLLM v1 grow a decoding request one block at a time)."""
        pool = self.pool
        return pool.allocate_one() if pool.num_free else self.allocate(1)[0]

    def register(self, block: int, key: int) -> bool:
        """Make a computed block findable by ``key`` (first writer wins; a duplicate stays private)."""
        if key in self._by_key or block in self._key_of:
            return False
        self._by_key[key] = block
        self._key_of[block] = key
        return True

    def register_many(self, blocks: Sequence[int], keys: Sequence[int], start: int, end: int) -> int:
        """``register(blocks[i], keys[i])`` for i in start..end-1; returns how many became findable."""
        by_key, key_of = self._by_key, self._key_of
        new = 0
        for i in range(start, end):
            key, block = keys[i], blocks[i]
            if key in by_key or block in key_of:
                continue
            by_key[key] = block
            key_of[block] = key
            new += 1
        return new

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one user of each block; cached blocks with no user become cached-free (most recent last).

        Freed in reverse so a request's tail blocks are reclaimed before its prefix (prefixes are shared more).
        """
        # one pass with the pool's arrays at hand: a replay frees ~10^6 blocks (BlockPool.unref's checks, inline)
        rc, key_of, lru = self.pool.ref_count, self._key_of, self._lru
        done: list[int] = []
        for b in reversed(blocks):
            c = rc[b]
            if c <= 0:
                raise BlockPoolError(f"block {b} freed twice (reference count already 0)")
            rc[b] = c - 1
            if c == 1:
                if b in key_of:
                    lru[b] = None
                else:
                    done.append(b)
        self.pool.release_many(done)

    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def keep_own_blocks(cache: PrefixCache, seq: Seq, tokens_per_block: int, written: int) -> None:
    """Before ``seq`` is preempted: make its full blocks holding ``written`` tokens of K/V findable. Past what its
    trace hashes cover (its prompt's tail, the tokens it generated) a block's key is the request's own (its id and
    the block's index), so only it finds them, when it recomputes: as vLLM's prefix caching and TensorRT-LLM's block
    reuse find a preempted request's blocks by their tokens. (Without them a request with no hashes recomputed
    from scratch, and vllm-v1 re-admitted one whose next chunk did not fit every other step, to preempt it again.)"""
    full = min(written // tokens_per_block, len(seq.blocks))
    keys = seq_keys(seq, tokens_per_block)
    if full > len(keys):
        seq.keys = keys = keys + tuple(hash(("own", seq.req.id, i)) for i in range(len(keys), full))
        seq.num_keys = full
    cache.register_many(seq.blocks, keys, seq.registered, full)
