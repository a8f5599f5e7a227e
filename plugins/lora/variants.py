"""Which kernel a LoRA plugin layer runs (its TensorRT tactics) and how much scratch it reserves. Plain Python.

Tactics (IPluginV3 ``get_valid_tactics`` / ``set_tactic``; TensorRT times them on the real GPU at build time):

- ``AUTO`` (1): the Triton small-batch kernel up to ``SMALL_MAX_TOKENS`` tokens, the fused CUDA kernel above;
- a value of ``spec.TILE_CHOICES`` (32..256): always the fused CUDA kernel with that H tile;
- ``TRITON_BASE + i``: always the Triton kernel with ``triton_kernel.SMALL_CONFIGS[i]``.

Scratch (issue 17, item 3): the fused kernel's scratch is sized once from the optimization profile's maximum token
count, recorded at build time (``configure_plugin`` sees ``DynamicPluginTensorDesc.max``) and serialized with the
plugin (``max_tokens``), then allocated when TensorRT attaches the plugin to an execution context, before any
enqueue and so never inside a graph capture, and kept until the plugin is destroyed: no launch ever grows or frees
it, so CUDA graphs captured at any batch size keep valid pointers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from . import spec
from .launch import scratch_bytes
from .triton_kernel import SMALL_CONFIGS

AUTO = 1  # TensorRT reserves tactic 0 (its default) and refuses it as a custom tactic
TRITON_BASE = 1000
SMALL_MAX_TOKENS = 128  # decode: the Triton kernel; above, the fused kernel (until GPU timings move it)
EXTRA_FIELDS: tuple[str, ...] = ("variant", "max_tokens")  # serialized beside spec.FIELD_NAMES, not ONNX attributes


def valid_tactics() -> list[int]:
    return [AUTO, *spec.TILE_CHOICES, *(TRITON_BASE + i for i in range(len(SMALL_CONFIGS)))]


@dataclass(frozen=True)
class Choice:
    kernel: str  # "triton" | "fused"
    tile: int  # fused: the H tile
    config: int  # triton: index into SMALL_CONFIGS


def choose(variant: int, tile: int, num_tokens: int) -> Choice:
    """The kernel for ``num_tokens`` tokens under tactic ``variant`` (``tile``: the layer's fused tile field)."""
    if variant in spec.TILE_CHOICES:
        return Choice("fused", variant, 0)
    if TRITON_BASE <= variant < TRITON_BASE + len(SMALL_CONFIGS):
        return Choice("triton", tile, variant - TRITON_BASE)
    if num_tokens <= SMALL_MAX_TOKENS:
        return Choice("triton", tile, 0)
    return Choice("fused", tile, 0)


def profile_max_tokens(x_max_dims: Sequence[int]) -> int:
    """Tokens at the profile's maximum x shape (product of all but the last dim); 0 when unknown (-1 dims)."""
    dims = [int(d) for d in x_max_dims[:-1]]
    return math.prod(dims) if dims and min(dims) > 0 else 0


def reserved_scratch_bytes(fields: spec.LoraFields, max_tokens: int, sm_count: int) -> int:
    """Scratch that covers every launch of the fused kernel up to ``max_tokens`` tokens, under any tile.

    ``scratch_bytes`` grows with T for a fixed ``n_hs``, and ``plan_launch``'s ``n_hs`` is largest at T = 1 with the
    smallest tile, so that ``n_hs`` at ``max_tokens`` tokens bounds them all."""
    if max_tokens <= 0:
        return 0
    from .launch import plan_launch

    n_hs = plan_launch(fields, 1, "float32", tile=min(spec.TILE_CHOICES), sm_count=sm_count).n_hs
    return scratch_bytes(max_tokens, fields.num_slots, fields.max_rank, n_hs)
