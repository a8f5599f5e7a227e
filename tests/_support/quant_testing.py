"""Shared by tests/build_engine/quantize: the tiny Llama config and held-out inputs (never used for calibration)."""

from __future__ import annotations

import numpy as np

from trtforge.examples.llama import LlamaConfig

TINY = LlamaConfig(layers=1, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256, vocab=256)


def held_out(seed: int = 1234, count: int = 4, seq: int = 24) -> list[dict[str, np.ndarray]]:
    """Inputs never used for calibration (calibration uses seed 0)."""
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, TINY.vocab, (1, seq)).astype(np.int64)} for _ in range(count)]
