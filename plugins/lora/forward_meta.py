"""Which LoRA layer of a forward builds the shared token order / chunk table (``lora_prepare``). Plain Python.

All LoRA nodes of one forward read the same ``lora_slot_ids`` tensor, so the fused kernel's sort is done once per
forward (issue 17 item 5), as vLLM's Punica wrapper does, instead of by every node. The first layer on the fused
path to enqueue for a key becomes that key's leader; every later forward the leader enqueues ``lora_prepare`` into
its own metadata buffer (reserved at attach time, never freed while the layer lives, so CUDA graphs captured at any
batch size keep a valid pointer) just before its own launch, and the key's other layers pass that buffer to theirs.

Key: (execution context token, stream, slot_ids device pointer, token count, tokens per slot, slot count). Why:

- stream: the followers read the buffer in stream order after the leader's prepare. TensorRT may run parallel
  layers (q/k/v projections) on auxiliary streams; a layer on another stream gets a key, a leader and a buffer of its
  own, so no layer ever reads a buffer written on a stream it is not ordered after.
- slot count: it decides which ids are out of range (no adapter) and the table layout (max_chunks).
- token count / tokens per slot: the set of layers on the fused path depends on the batch (tactic AUTO uses the
  Triton kernel up to 128 tokens), so the leader is elected per batch shape; for one shape TensorRT enqueues the
  same layers in the same order every forward, so the leader is always the first of them and no follower reads a
  buffer before this forward's prepare.
- execution context: two contexts may be bound to one slot_ids buffer and run on one stream; each has its own leader.
  The token is the Python identity of the context object ``attach_to_context`` received; if TensorRT hands every
  layer a different wrapper object, every layer leads its own key and sorts for itself (correct, only slower).

A destroyed leader unregisters its keys (a later context could reuse the token), so nobody reads a freed buffer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

Key = tuple[int, int, int, int, int, int]  # (context, stream, slot_ids pointer, num_tokens, tokens_per_slot, slots)


@dataclass(frozen=True)
class Role:
    prepare: bool  # this layer enqueues lora_prepare into ``meta`` before its own launch
    meta: int  # the metadata buffer this layer's fused launch reads (0: the launch sorts by itself)


class ForwardMeta:
    """Leader election per key; thread-safe (contexts may enqueue from several host threads)."""

    def __init__(self) -> None:
        self._leaders: dict[Key, tuple[int, int]] = {}  # key -> (owner id, owner's metadata buffer)
        self._lock = threading.Lock()

    def role(self, key: Key, owner: int, meta: int) -> Role:
        """The role of layer ``owner`` (whose own buffer is ``meta``, 0 if it has none) for ``key``."""
        with self._lock:
            leader = self._leaders.get(key)
            if leader is None:
                if not meta:  # no buffer to share: sort in the kernel, elect nobody
                    return Role(False, 0)
                leader = self._leaders[key] = (owner, meta)
        if leader[0] == owner:
            return Role(True, leader[1])
        return Role(False, leader[1])

    def forget(self, owner: int) -> None:
        """Drop every key ``owner`` leads (it is being destroyed); the next enqueue of such a key elects anew."""
        with self._lock:
            for key in [k for k, (o, _) in self._leaders.items() if o == owner]:
                del self._leaders[key]

    def __len__(self) -> int:
        return len(self._leaders)


REGISTRY = ForwardMeta()  # one per process: keys carry the context token
