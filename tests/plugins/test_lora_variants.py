"""Tactic choice and scratch sizing from the profile's maximum (issue 17, items 3 and 7), without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from trtforge.plugins.lora import spec
from trtforge.plugins.lora.launch import plan_launch, scratch_bytes
from trtforge.plugins.lora.triton_kernel import SMALL_CONFIGS
from trtforge.plugins.lora.variants import (
    AUTO,
    SMALL_MAX_TOKENS,
    TRITON_BASE,
    choose,
    profile_max_tokens,
    reserved_scratch_bytes,
    valid_tactics,
)


def test_tactics_cover_every_variant_and_avoid_tensorrt_default():
    tactics = valid_tactics()
    assert 0 not in tactics and len(set(tactics)) == len(tactics)  # TensorRT refuses 0 as a custom tactic
    assert {choose(t, 128, 1).kernel for t in tactics} == {"triton", "fused"}
    assert [choose(TRITON_BASE + i, 64, 5000).config for i in range(len(SMALL_CONFIGS))] == list(
        range(len(SMALL_CONFIGS)))
    assert choose(64, 128, 1) == choose(64, 128, 10**6) and choose(64, 128, 1).tile == 64


def test_auto_switches_at_the_small_batch_limit():
    assert choose(AUTO, 128, 1).kernel == choose(AUTO, 128, SMALL_MAX_TOKENS).kernel == "triton"
    assert choose(AUTO, 32, SMALL_MAX_TOKENS + 1) == choose(AUTO, 32, 70000)
    assert choose(AUTO, 32, 70000).kernel == "fused" and choose(AUTO, 32, 70000).tile == 32


def test_profile_max_tokens():
    assert profile_max_tokens((4, 64, 4096)) == 256 and profile_max_tokens((2048, 4096)) == 2048
    assert profile_max_tokens((-1, 4096)) == 0


@pytest.mark.parametrize("max_tokens", [1, 7, 128, 2048, 70000])
def test_reserved_scratch_covers_every_launch_up_to_the_maximum(max_tokens):
    """No launch at or below the profile's maximum, under any tile, needs more than what attach reserves."""
    g = np.random.default_rng(max_tokens)
    f = spec.LoraFields(16, int(g.integers(1, 4097)), 4096, int(g.integers(64, 8193)))
    reserved = reserved_scratch_bytes(f, max_tokens, sm_count=132)
    sizes = {1, max_tokens, *map(int, g.integers(1, max_tokens + 1, size=40))}
    for t in sorted(sizes):
        for tile in spec.TILE_CHOICES:
            p = plan_launch(f, t, "float16", tile=tile, sm_count=132)
            assert p.scratch_bytes <= reserved, (t, tile)
    n_hs = plan_launch(f, 1, "float16", tile=32, sm_count=132).n_hs
    assert reserved == scratch_bytes(max_tokens, f.num_slots, 16, n_hs)  # not more than the bound
    assert reserved_scratch_bytes(f, 0, 132) == 0  # unknown maximum: nothing reserved up front
