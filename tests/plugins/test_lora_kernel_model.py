"""A NumPy model of kernel.cu that mirrors its loops, index math and scratch layout, run on the real launch plans.

No GPU here, so this is how the kernel's logic is checked on CPU. Each CUDA block is a Python generator, its 256
threads are NumPy vectors (``tid``); every global, scratch and shared-memory access goes through a bounds check;
shared memory starts as NaN (garbage), so reading a word no thread wrote shows up in the result. The scratch is one
flat int32 buffer with kernel.cu's layout, zeroed ONCE and reused across launches of different sizes, as the
launcher does. A scheduler starts blocks (each takes a ticket from ctrl[0], as the kernel does), caps how many are
resident, and always runs the most recently started runnable block first, so a consumer runs as soon as its flag
says it may (an early read of a half-written buffer shows up as a wrong result; a wait that can never end shows up
as a deadlock). The fp32 arithmetic follows the kernel's summation order (not bit-exact: the GPU fuses multiply-adds).

If kernel.cu changes, change the mirror here line for line.
"""

from __future__ import annotations

import numpy as np
import pytest
from lora_kernel_mirror import check, fused_launch, make_case, simple_launch

from trtforge.plugins.lora import spec
from trtforge.plugins.lora.launch import plan_launch


def run_fused(case: dict, mem: np.ndarray, dt: str, resident: int, seed: int, old_reset: bool = False,
              tile: int | None = None) -> np.ndarray:
    f = case["fields"]
    tokens = int(np.prod(case["x"].shape[:-1]))
    tps = spec.tokens_per_slot(case["x"].shape, case["ids"].shape)
    p = plan_launch(f, tokens, dt, tile=tile, sm_count=132)
    assert p.scratch_bytes <= mem.nbytes
    y = case["y"].reshape(-1).copy()
    fused_launch(mem, case["x"].reshape(-1), y, case["a"].reshape(-1), case["b"].reshape(-1), case["ids"],
                 case["scales"], tps, p, f, np.random.default_rng(seed), resident, old_reset)
    assert not mem[:4].any(), "control words must be zero after every launch"
    return y


SHAPES = [  # tokens, H, Of, max_rank, adapter rank, slots, dtype, tile, per-sequence length
    (1, 300, 200, 16, 16, 8, "float16", 128, 0),
    (7, 1000, 1500, 8, 8, 8, "bfloat16", 64, 0),
    (40, 130, 70, 64, 5, 3, "float32", 32, 0),
    (33, 257, 300, 16, 8, 8, "float16", 256, 0),
    (24, 96, 130, 3, 3, 2, "bfloat16", 32, 4),
    (2100, 40, 36, 4, 4, 3, "float32", 32, 0),  # two sort batches (> LORA_THREADS * LORA_SORT_UNROLL tokens)
]


@pytest.mark.parametrize("tokens,h,o,max_rank,rank,n,dt,tile,per_seq", SHAPES)
def test_fused_kernel_model_matches_reference(tokens, h, o, max_rank, rank, n, dt, tile, per_seq):
    case = make_case(tokens, h, o, max_rank, rank, n, dt, seed=tokens * 7 + h, per_seq=per_seq)
    if not per_seq:
        case["ids"][0] = n  # out of range: no adapter (the reference rejects it; the kernels skip it)
    mem = np.zeros(1 << 16, np.int32)  # zeroed once, like the launcher's scratch
    for resident in (10**9, 1, 3):  # everything resident; one block at a time; a few
        got = run_fused(case, mem, dt, resident, seed=resident, tile=tile)
        check(case, got, dt, case["ids"])


@pytest.mark.parametrize("tokens,h,o,max_rank,rank,n,dt,tile,per_seq", SHAPES)
def test_fused_kernel_model_out_of_place(tokens, h, o, max_rank, rank, n, dt, tile, per_seq):
    """out = y + update written by the kernel itself (expand + COPY blocks): every element of a NaN-filled out
    written, rows without adapter bit-exact copies of y, y untouched; a few copy blocks so each loops."""
    case = make_case(tokens, h, o, max_rank, rank, n, dt, seed=tokens * 13 + h, per_seq=per_seq)
    if not per_seq:
        case["ids"][0] = n
    f = case["fields"]
    tps = spec.tokens_per_slot(case["x"].shape, case["ids"].shape)
    p = plan_launch(f, tokens, dt, tile=tile, sm_count=3, out_of_place=True)
    assert p.n_copy == min(tokens, 3) and p.grid[0] == 1 + p.max_chunks * (p.n_hs + p.n_ot) + p.n_copy
    mem = np.zeros(1 << 16, np.int32)
    y = case["y"].reshape(-1).copy()
    out = np.full_like(y, np.nan)
    fused_launch(mem, case["x"].reshape(-1), y, case["a"].reshape(-1), case["b"].reshape(-1), case["ids"],
                 case["scales"], tps, p, f, np.random.default_rng(tokens), 3, out=out)
    assert np.array_equal(y.view(np.uint8), case["y"].reshape(-1).view(np.uint8)), "y must stay unchanged"
    assert not mem[:4].any()
    check(case, out, dt, case["ids"])


@pytest.mark.parametrize("tokens,h,o,max_rank,rank,n,dt,tile,per_seq", SHAPES)
def test_simple_kernel_model_matches_reference(tokens, h, o, max_rank, rank, n, dt, tile, per_seq):
    case = make_case(tokens, h, o, max_rank, rank, n, dt, seed=tokens * 11 + o, per_seq=per_seq)
    f = case["fields"]
    tps = spec.tokens_per_slot(case["x"].shape, case["ids"].shape)
    flat = {k: case[k].reshape(-1) for k in ("x", "y", "a", "b")}
    out = np.zeros_like(flat["y"])
    simple_launch(flat["x"], flat["y"], out, flat["a"], flat["b"], case["ids"], case["scales"], tps, f, dt)
    check(case, out, dt, case["ids"])
    inplace = flat["y"].copy()
    simple_launch(flat["x"], inplace, inplace, flat["a"], flat["b"], case["ids"], case["scales"], tps, f, dt)
    assert np.array_equal(inplace.view(np.uint8), out.view(np.uint8))


SEQUENCE = [40, 1, 33, 7, 60, 2, 60]  # growing and shrinking sizes on one scratch, never re-zeroed


def test_one_scratch_across_launches_of_different_sizes():
    mem = np.zeros(1 << 17, np.int32)
    for i, tokens in enumerate(SEQUENCE):
        case = make_case(tokens, 130, 96, 16, 16, 4, "float16", seed=100 + i)
        got = run_fused(case, mem, "float16", resident=10**9, seed=i)
        check(case, got, "float16", case["ids"])


def test_model_catches_the_stale_counter_bug():
    """The pre-fix kernel zeroed chunk_done in its last block, at positions that depend on T: after a 1-token launch,
    a 200-token launch found the 1-token launch's chunk table and fp32 partials in its counters (an expand block ran
    before its shrink slices, or waited forever). The GPU test's launch sequence 2048, 1, 300 would have failed; this
    model must fail the same way with the old reset and pass with the fix."""
    def sequence(old_reset: bool) -> None:
        mem = np.zeros(1 << 17, np.int32)
        for i, tokens in enumerate((1, 200)):
            case = make_case(tokens, 130, 96, 16, 16, 4, "float16", seed=300 + i)
            case["ids"][0] = 1  # the 1-token launch writes a chunk table and partials
            got = run_fused(case, mem, "float16", resident=10**9, seed=i, old_reset=old_reset)
            check(case, got, "float16", case["ids"])

    sequence(old_reset=False)
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        sequence(old_reset=True)


def test_all_tokens_in_one_slot_fit_max_chunks():
    for tokens in (1, 15, 16, 17, 50):
        case = make_case(tokens, 64, 40, 8, 8, 8, "float32", seed=tokens)
        case["ids"][:] = 5
        got = run_fused(case, np.zeros(1 << 15, np.int32), "float32", resident=10**9, seed=0)
        check(case, got, "float32", case["ids"])
