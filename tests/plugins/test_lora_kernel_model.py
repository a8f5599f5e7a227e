"""A NumPy model of the fused kernel's work split (kernel.cu), run ticket by ticket on the real launch plans.

No GPU here, so this checks the part of the kernel that is pure index arithmetic: the sort into single-slot chunks
(at most ``max_chunks``), the ticket -> role mapping, H slices rounded to the tile, O tiles rounded to 32, the
empty-slice bookkeeping and the chunk_done counts each expand block waits for. It mirrors kernel.cu's formulas line
for line (if one changes, change both); the arithmetic inside a block (fp32 sums) is left to tests/gpu.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtforge.plugins.lora import reference, spec
from trtforge.plugins.lora.launch import plan_launch
from trtforge.plugins.lora.ptx import kernel_define

G = kernel_define("LORA_TOKENS")


def emulate(x, y, a, b, slot_ids, scales, tokens_per_slot, p, f):  # type: ignore[no-untyped-def]
    t_count, h = x.shape
    o = b.shape[-1]
    y = y.astype(np.float64).copy()
    tok_slot = slot_ids[np.arange(t_count) // tokens_per_slot]
    # SORT (ticket 0): per slot, tokens in any order (the kernel's order within a slot is not fixed: shuffle)
    rng = np.random.default_rng()
    chunks, order = [], []
    for s in range(f.num_slots):
        toks = rng.permutation(np.flatnonzero(tok_slot == s))
        for i in range(0, len(toks), G):
            chunks.append((len(order) + i, min(G, len(toks) - i), s))
        order.extend(toks.tolist())
    assert len(chunks) <= p.max_chunks
    done = [0] * p.max_chunks
    vpart = np.zeros((p.n_hs, t_count, f.max_rank))
    h_per_slice = -(-(-(-h // p.n_hs)) // p.tile) * p.tile
    o_tile = -(-(-(-o // p.n_ot)) // 32) * 32
    covered_h = np.zeros((len(chunks), h), int)
    covered_o = np.zeros((len(chunks), o), int)
    n_shrink = p.max_chunks * p.n_hs
    for ticket in range(1, p.grid[0]):
        i = ticket - 1
        if i < n_shrink:
            c, k = divmod(i, p.n_hs)
            if c >= len(chunks):
                continue
            if k * h_per_slice >= h:
                done[c] += 1
                continue
            start, count, s = chunks[c]
            hs = slice(k * h_per_slice, min(h, (k + 1) * h_per_slice))
            covered_h[c, hs] += 1
            toks = order[start:start + count]
            vpart[k, start:start + count] = x[toks, hs].astype(np.float64) @ a[s, hs].astype(np.float64)
            done[c] += 1
        else:
            c, j = divmod(i - n_shrink, p.n_ot)
            if c >= len(chunks) or j * o_tile >= o:
                continue
            assert done[c] == p.n_hs, "an expand block would wait for a slice that never arrives"
            start, count, s = chunks[c]
            v = vpart[:, start:start + count].sum(0) * float(scales[s])
            os_ = slice(j * o_tile, min(o, (j + 1) * o_tile))
            covered_o[c, os_] += 1
            toks = order[start:start + count]
            y[toks, os_] += v @ b[s][:, os_].astype(np.float64)
    assert (covered_h == 1).all() and (covered_o == 1).all()
    return y


@pytest.mark.parametrize("tokens,h,o,r,n,tile,per_seq", [
    (1, 4096, 4096, 16, 8, 128, False), (7, 1000, 1500, 8, 8, 64, False), (128, 4096, 4096, 64, 8, 256, False),
    (300, 520, 700, 16, 3, 32, False), (2048, 256, 384, 16, 8, 128, False), (64, 200, 96, 4, 5, 64, True),
])
def test_work_split_covers_every_token_slice_and_tile(tokens, h, o, r, n, tile, per_seq):
    g = np.random.default_rng()
    x = g.standard_normal((tokens, h))
    y = g.standard_normal((tokens, o))
    a = g.standard_normal((n, h, r))
    b = g.standard_normal((n, r, o))
    scales = g.uniform(0.5, 2, n)
    tps = 4 if per_seq else 1
    ids = g.integers(-1, n, size=tokens // tps).astype(np.int32)
    f = spec.LoraFields(r, n, h, o, tile)
    p = plan_launch(f, tokens, "float16", sm_count=132)
    got = emulate(x, y, a, b, ids, scales, tps, p, f)
    x_shape = (tokens // 4, 4, h) if per_seq else (tokens, h)
    want = y + reference.lora_update(x.reshape(x_shape), a, b, ids, scales).reshape(tokens, o)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_all_tokens_in_one_slot_fit_max_chunks():
    f = spec.LoraFields(16, 8, 256, 256, 64)
    for tokens in (1, 15, 16, 17, 1000):
        p = plan_launch(f, tokens, "bfloat16")
        g = np.random.default_rng()
        ids = np.full(tokens, 5, np.int32)
        x, y = g.standard_normal((tokens, 256)), g.standard_normal((tokens, 256))
        a, b = g.standard_normal((8, 256, 16)), g.standard_normal((8, 16, 256))
        got = emulate(x, y, a, b, ids, np.ones(8), 1, p, f)
        np.testing.assert_allclose(got, y + (x @ a[5]) @ b[5], rtol=1e-9, atol=1e-9)
