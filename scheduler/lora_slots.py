"""LoRA adapter slots: which adapter sits in which of the engine's ``num_slots`` slot-pool rows.

The LoRA plugin (its contract: ``plugins/lora/spec.py``)
reads adapters from a slot pool that is a runtime input, so loading an adapter
is a copy into a slot, not a rebuild. Safety conditions:
- a slot is *pinned* while any running request uses its adapter (reference count > 0); a pinned slot is never
  reclaimed, so a running request's adapter cannot change under it;
- an unpinned resident adapter stays loaded (a later request reuses it for free) until a slot is needed, then
  the least recently unpinned one is reclaimed;
- a request naming an adapter that is not registered is rejected by the scheduler (``known``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from trtforge.build_engine.core.errors import InputError

from .block_pool import BlockPoolError


class LoraSlots:
    def __init__(self, num_slots: int, adapters: Iterable[str] = ()) -> None:
        if num_slots < 0:
            raise InputError(f"LoRA slots must be >= 0, got {num_slots}")
        self.num_slots = num_slots
        self.known: set[str] = set(adapters)
        self.slot_of: dict[str, int] = {}
        self.users: dict[str, int] = {}
        self._fresh = 0  # slots 0.._fresh-1 were handed out once; a slot is never freed (unpinned: ``_idle``), so
        # the never-used ones are a count, not a list (--lora-slots 10**9 built a list of 10**9 slot numbers)
        self._idle: OrderedDict[str, None] = OrderedDict()  # resident, unpinned, LRU first
        self.loads = 0

    def register(self, adapter: str) -> None:
        self.known.add(adapter)

    def can_acquire(self, adapter: str | None) -> bool:
        if adapter is None:
            return True
        return adapter in self.slot_of or self._fresh < self.num_slots or bool(self._idle)

    def acquire(self, adapter: str | None) -> int:
        """Pin ``adapter``'s slot for one more user, loading it into a free or reclaimed slot; -1 for no adapter."""
        if adapter is None:
            return -1
        if adapter not in self.known:
            raise InputError(f"unknown LoRA adapter {adapter!r}; register it first")
        if adapter in self.slot_of:
            self._idle.pop(adapter, None)
        else:
            if self._fresh < self.num_slots:
                slot = self._fresh
                self._fresh += 1
            elif self._idle:
                victim, _ = self._idle.popitem(last=False)
                slot = self.slot_of.pop(victim)
            else:
                raise BlockPoolError(f"no LoRA slot for {adapter!r}: all {self.num_slots} are pinned")
            self.slot_of[adapter] = slot
            self.loads += 1
        self.users[adapter] = self.users.get(adapter, 0) + 1
        return self.slot_of[adapter]

    def release(self, adapter: str | None) -> None:
        """One user less; the slot stays resident but becomes reclaimable when no user is left."""
        if adapter is None:
            return
        n = self.users.get(adapter, 0)
        if n <= 0:
            raise BlockPoolError(f"LoRA adapter {adapter!r} released more times than acquired")
        if n == 1:
            del self.users[adapter]
            self._idle[adapter] = None
        else:
            self.users[adapter] = n - 1

    def pinned(self) -> set[str]:
        return set(self.users)
