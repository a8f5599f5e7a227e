"""A pool of KV-cache blocks as integers: a free list and reference counts (vLLM v1's ``BlockPool`` idea).

Safety conditions (checked, never assumed):
- a block is handed out only from the free list, so it is never given to two owners unless shared explicitly
  through ``ref`` (prefix sharing);
- ``unref`` of a block whose count is already 0 raises (no double free);
- a block returns to the free list only when its count reaches 0 *and* its owner (the prefix cache) does not keep
  it as cached-free; ``release`` is that owner's hand-back.
No GPU memory is touched: the block ids index the engine's KV-cache pages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from trtforge.build_engine.core.errors import TrtforgeError


class BlockPoolError(TrtforgeError):
    """A block accounting invariant was violated (a bug in the caller)."""

    exit_code = 1


class BlockPool:
    """``num_blocks`` blocks, ids ``0..num_blocks-1``."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise BlockPoolError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._is_free = bytearray([1]) * num_blocks
        self.ref_count = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the free list with reference count 1; all or nothing."""
        if n > len(self._free):
            raise BlockPoolError(f"asked for {n} blocks with {len(self._free)} free")
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self._is_free[b] = 0
            self.ref_count[b] = 1
        return out

    def allocate_one(self) -> int:
        """``allocate(1)[0]`` without the list."""
        if not self._free:
            raise BlockPoolError("asked for 1 block with 0 free")
        b = self._free.popleft()
        self._is_free[b] = 0
        self.ref_count[b] = 1
        return b

    def reuse(self, blocks: list[int]) -> list[int]:
        """Hand out blocks whose count is 0 but that are not on the free list (the prefix cache's reclaimed
        cached-free blocks) with count 1: what ``release`` then ``allocate`` would do, without the round trip."""
        rc, is_free = self.ref_count, self._is_free
        for b in blocks:
            if rc[b] != 0 or is_free[b]:
                raise BlockPoolError(f"block {b} reused while in use or free (count {rc[b]})")
            rc[b] = 1
        return blocks

    def ref(self, block: int) -> None:
        """One more owner of an allocated block (a prefix-cache hit)."""
        if self._is_free[block]:
            raise BlockPoolError(f"block {block} is free; it cannot be shared")
        self.ref_count[block] += 1

    def ref_many(self, blocks: Sequence[int]) -> None:
        """``ref`` of each block, in one pass (a replay takes ~10^6 prefix hits)."""
        rc, is_free = self.ref_count, self._is_free
        for b in blocks:
            if is_free[b]:
                raise BlockPoolError(f"block {b} is free; it cannot be shared")
            rc[b] += 1

    def unref(self, block: int) -> int:
        """One owner less; returns the new count. The caller decides what a count of 0 means (``release``)."""
        if self.ref_count[block] <= 0:
            raise BlockPoolError(f"block {block} freed twice (reference count already 0)")
        self.ref_count[block] -= 1
        return self.ref_count[block]

    def release(self, block: int) -> None:
        """Put a block whose count is 0 back on the free list."""
        if self.ref_count[block] != 0:
            raise BlockPoolError(f"block {block} released while {self.ref_count[block]} requests use it")
        if self._is_free[block]:
            raise BlockPoolError(f"block {block} released twice")
        self._is_free[block] = 1
        self._free.append(block)

    def release_many(self, blocks: list[int]) -> None:
        """``release`` of each block, in order."""
        rc, is_free = self.ref_count, self._is_free
        for b in blocks:
            if rc[b] != 0:
                raise BlockPoolError(f"block {b} released while {rc[b]} requests use it")
            if is_free[b]:
                raise BlockPoolError(f"block {b} released twice")
            is_free[b] = 1
        self._free.extend(blocks)

    def is_free(self, block: int) -> bool:
        return bool(self._is_free[block])
