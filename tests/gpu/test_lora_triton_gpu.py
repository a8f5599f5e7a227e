"""The Triton small-batch LoRA kernel and the plugin's default path (tactic AUTO) on a real GPU against float64.

Same helpers as test_lora_kernel.py (cuda-python driver, bf16 by bit arithmetic); the Triton kernel is built by
``triton_build.compile_image`` for this GPU (needs triton, as the plugin does at build time) and launched through
``small_launch`` exactly as ``enqueue`` launches it. Skipped without a CUDA device (a failure under run_all.sh).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plain_run  # noqa: E402  (tests/_support)
import test_lora_kernel as t  # noqa: E402
from test_lora_kernel import pytest  # noqa: E402  (pytest or the plain-run stand-in)

dev = t.dev  # the module-scoped Device fixture

DTYPES = ["float16", "bfloat16", "float32"]
CASES = list(itertools.product([1, 7, 128, 512, 2048], [(4096, 4096), (1000, 1500)], [8, 16, 64], DTYPES))


def _id(tokens: int, hw: tuple[int, int], r: int, d: str) -> str:
    return f"T{tokens}-H{hw[0]}xO{hw[1]}-r{r}-{d}"


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,hw,rank,dtype", CASES, ids=[_id(*c) for c in CASES])
def test_triton_default_config_matches_float64(dev, tokens, hw, rank, dtype):
    case = t.make_case(tokens, hw[0], hw[1], rank, 8, seed=tokens * 31 + rank)
    got, y_seen = t.run_kernel(dev, case, dtype, "triton0")
    t.check(case, got, y_seen, dtype, "triton0 " + _id(tokens, hw, rank, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_triton_config(dev, config, dtype):
    for tokens, rank in ((7, 16), (128, 64), (300, 8)):
        case = t.make_case(tokens, 1000, 1500, rank, 8, seed=config * 100 + tokens)
        got, y_seen = t.run_kernel(dev, case, dtype, f"triton{config}")
        t.check(case, got, y_seen, dtype, f"triton{config} T{tokens} r{rank} {dtype}")


@pytest.mark.gpu
def test_triton_4096_slots_per_sequence_and_out_of_range(dev):
    case = t.make_case(128, 4096, 4096, 16, 4096, seed=5)
    case["ids"][:5] = [4096, 5000, -1, 4095, 0]  # out of range -> no adapter; the last slot; slot 0
    got, y_seen = t.run_kernel(dev, case, "bfloat16", "triton0")
    t.check(case, got, y_seen, "bfloat16", "triton0 4096 slots")
    seq = t.make_case(64, 1000, 700, 16, 8, seed=6, per_sequence=True)
    got, y_seen = t.run_kernel(dev, seq, "float16", "triton0")
    t.check(seq, got, y_seen, "float16", "triton0 per sequence")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 128, 129, 2048, 70000])
def test_plugin_default_path(dev, tokens):
    """Tactic AUTO, out of place (the default engine): Triton up to 128 tokens, the fused kernel + copy above."""
    h, o = (4096, 4096) if tokens <= 2048 else (4096, 1000)
    case = t.make_case(tokens, h, o, 16, 8, seed=tokens)
    got, y_seen = t.run_kernel(dev, case, "float16", "plugin")
    t.check(case, got, y_seen, "float16", f"plugin path T{tokens}")


def _main() -> int:
    """Without pytest: every test in order, one line each, exit 1 on any failure."""
    t._gpu_or_skip()
    d = t.Device()
    runs = [(f"triton0 {_id(*c)}", test_triton_default_config_matches_float64, c) for c in CASES]
    runs += [(f"triton{c} {dt}", test_every_triton_config, (c, dt)) for c in (1, 2, 3) for dt in DTYPES]
    runs += [("4096 slots / per sequence", test_triton_4096_slots_per_sequence_and_out_of_range, ())]
    runs += [(f"plugin path T{n}", test_plugin_default_path, (n,)) for n in (1, 128, 129, 2048, 70000)]
    return plain_run.run_plain(d, runs)


if __name__ == "__main__":
    raise SystemExit(_main())
