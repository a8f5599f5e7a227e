"""A NumPy mirror of plugins/lora/kernel.cu (its loops, index math and scratch layout), for
tests/plugins/test_lora_kernel_model.py. See that file's docstring for how the mirror works.

If kernel.cu changes, change the mirror here line for line.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

from trtforge.plugins.lora import reference, spec
from trtforge.plugins.lora.launch import plan_simple, simple_o_tile
from trtforge.plugins.lora.ptx import kernel_define

THREADS, G, MAXR = kernel_define("LORA_THREADS"), kernel_define("LORA_TOKENS"), kernel_define("LORA_MAX_RANK")
UNROLL = kernel_define("LORA_SORT_UNROLL")
META_WORDS = kernel_define("LORA_META_WORDS")
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}
tid = np.arange(THREADS)
f32 = np.float32


def ld(arr: np.ndarray, idx):  # type: ignore[no-untyped-def]
    """Bounds-checked gather (NumPy would wrap negative indices silently)."""
    idx = np.asarray(idx)
    assert idx.size == 0 or (idx.min() >= 0 and idx.max() < arr.size), f"out of bounds {idx.min()}..{idx.max()}"
    return arr[idx]


def st(arr: np.ndarray, idx, val) -> None:  # type: ignore[no-untyped-def]
    idx = np.asarray(idx)
    assert idx.size == 0 or (idx.min() >= 0 and idx.max() < arr.size), f"out of bounds {idx.min()}..{idx.max()}"
    arr[idx] = val


def _warp_groups(sv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """__match_any_sync over one warp's 32 values: (peers bitmask per lane, leader = lowest lane of the group)."""
    peers = np.array([sum(1 << j for j in range(32) if sv[j] == sv[i]) for i in range(32)], np.int64)
    leader = np.array([(int(m) & -int(m)).bit_length() - 1 for m in peers])
    return peers, leader


def _popc(v: np.ndarray) -> np.ndarray:
    return np.array([bin(int(m)).count("1") for m in v])


def _slot_of(ids, t, T: int, tps: int, N: int):  # type: ignore[no-untyped-def]
    """lora_slot_of, vectorized."""
    s = np.where(t < T, ld(ids, np.where(t < T, t // tps, 0)), -1)
    return np.where((s >= 0) & (s < N), s, -1)


def _histogram(ids, T: int, tps: int, N: int, rng) -> np.ndarray:  # type: ignore[no-untyped-def]
    """lora_build_table's first pass: tokens per slot (shared hist), warp-aggregated atomics."""
    hist = np.zeros(N, np.int64)  # shared
    for t0 in range(0, T, THREADS * UNROLL):
        sv = [_slot_of(ids, t0 + u * THREADS + tid, T, tps, N) for u in range(UNROLL)]  # loads before any use
        for u in range(UNROLL):
            for w in rng.permutation(THREADS // 32):  # warps in any order
                ws = sv[u][w * 32:(w + 1) * 32]
                peers, leader = _warp_groups(ws)
                for i in range(32):
                    if ws[i] >= 0 and leader[i] == i:
                        hist[ws[i]] += _popc(peers[i:i + 1])[0]
    return hist


def _scatter(tab: np.ndarray, sorted_: int, cursor: np.ndarray, ids, T: int, tps: int, N: int,  # type: ignore[no-untyped-def]
             rng) -> None:
    """lora_build_table's last pass: each token to its slot's next position (cursor), warps in any order."""
    lane = tid % 32
    written = np.zeros(T, int)
    for t0 in range(0, T, THREADS * UNROLL):
        sv = [_slot_of(ids, t0 + u * THREADS + tid, T, tps, N) for u in range(UNROLL)]
        for u in range(UNROLL):
            for w in rng.permutation(THREADS // 32):  # warps race for the cursors in any order
                ws = sv[u][w * 32:(w + 1) * 32]
                peers, leader = _warp_groups(ws)
                base = np.zeros(32, np.int64)
                for i in range(32):
                    if ws[i] >= 0 and leader[i] == i:
                        base[i] = cursor[ws[i]]
                        cursor[ws[i]] += _popc(peers[i:i + 1])[0]
                base = base[leader]  # __shfl_sync(base, leader)
                below = _popc(peers & ((1 << lane[:32]) - 1))
                for i in range(32):
                    if ws[i] >= 0:
                        pos = base[i] + below[i]
                        assert pos < T and written[pos] == 0, "two tokens sorted into one position"
                        written[pos] = 1
                        st(tab, sorted_ + pos, t0 + u * THREADS + w * 32 + i)


def build_table(tab: np.ndarray, nchunks: int, start: int, clen: int, cslot: int, sorted_: int,  # type: ignore[no-untyped-def]
                ids, T: int, tps: int, N: int, max_chunks: int, rng) -> None:
    """lora_build_table into the int32 words of ``tab`` (the scratch, or a lora_prepare metadata buffer)."""
    hist = _histogram(ids, T, tps, N, rng)
    # parallel prefix: thread q owns slots [q * per, (q + 1) * per); block scan of its token and chunk counts
    per = -(-N // THREADS)
    s0 = np.minimum(N, tid * per)
    s1 = np.minimum(N, s0 + per)
    nt = np.array([hist[a:b].sum() for a, b in zip(s0, s1, strict=True)], np.int64)
    nc = np.array([(-(-hist[a:b] // G)).sum() for a, b in zip(s0, s1, strict=True)], np.int64)
    scan_tok, scan_chk = nt.copy(), nc.copy()
    d = 1
    while d < THREADS:  # inclusive Hillis-Steele scan, read all then write all (the two barriers)
        at = np.where(tid >= d, scan_tok[np.maximum(tid - d, 0)], 0)
        ac = np.where(tid >= d, scan_chk[np.maximum(tid - d, 0)], 0)
        scan_tok, scan_chk = scan_tok + at, scan_chk + ac
        d <<= 1
    cursor = np.zeros(N, np.int64)  # shared
    for q in rng.permutation(THREADS):  # threads write disjoint entries, in any order
        off, c = int(scan_tok[q] - nt[q]), int(scan_chk[q] - nc[q])
        for s in range(int(s0[q]), int(s1[q])):
            n = int(hist[s])
            cursor[s] = off
            for i in range(0, n, G):
                assert c < max_chunks, "more chunks than max_chunks"
                st(tab, start + c, off + i), st(tab, clen + c, min(G, n - i)), st(tab, cslot + c, s)
                c += 1
            off += n
    tab[nchunks] = scan_chk[THREADS - 1]
    _scatter(tab, sorted_, cursor, ids, T, tps, N, rng)


def prepare_launch(meta: np.ndarray, ids, T: int, tps: int, N: int, max_chunks: int, rng) -> None:  # type: ignore[no-untyped-def]
    """lora_prepare: the forward's table into ``meta`` (int32, launch.meta_bytes(T, N) // 4 words)."""
    assert meta.size * 4 >= 4 * (META_WORDS + 3 * max_chunks + T)
    t = META_WORDS
    build_table(meta, 0, t, t + max_chunks, t + 2 * max_chunks, t + 3 * max_chunks, ids, T, tps, N, max_chunks, rng)


@dataclass
class Layout:  # lora_scratch(base, meta, max_chunks, num_tokens): word offsets into the scratch
    done: int
    nchunks: int
    start: int
    len: int
    slot: int
    sorted: int
    vpart: int

    @classmethod
    def of(cls, max_chunks: int, num_tokens: int) -> Layout:
        done = 4
        return cls(done, 3, done + max_chunks, done + 2 * max_chunks, done + 3 * max_chunks, done + 4 * max_chunks,
                   done + 4 * max_chunks + num_tokens)


def fused_launch(mem: np.ndarray, x, y, a, b, ids, scales, tps, p, f, rng, resident: int,  # type: ignore[no-untyped-def]
                 old_reset: bool = False, meta: np.ndarray | None = None, out: np.ndarray | None = None) -> None:
    """One launch of lora_fused_* on flat buffers (y updated in place). ``old_reset`` replays the pre-fix kernel.
    ``meta``: a lora_prepare output for these ids (the launch then reads its table there and does not sort).
    ``out``: out of place (``p`` planned with ``out_of_place``): out = y + update, y unchanged."""
    memf = mem.view(np.float32)
    T, H, Of, R, N = len(y) // f.out_features, f.in_features, f.out_features, f.max_rank, f.num_slots
    L = Layout.of(p.max_chunks, T)
    n_shrink = p.max_chunks * p.n_hs
    n_work = n_shrink + p.max_chunks * p.n_ot
    dst = y if out is None else out
    assert (p.n_copy > 0) == (out is not None), "out of place needs COPY blocks, in place none"
    smem_words = p.shared_bytes // 4
    dt = y.dtype
    # the chunk table: in the scratch, or in the forward's metadata buffer (lora_scratch's pointers)
    tab, tw = (mem, (L.start, L.len, L.slot, L.sorted, L.nchunks)) if meta is None else (
        meta, (META_WORDS, META_WORDS + p.max_chunks, META_WORDS + 2 * p.max_chunks, META_WORDS + 3 * p.max_chunks, 0))

    def sort() -> None:  # lora_sort: zero this launch's chunk counters, build the table unless presorted, publish
        if not old_reset:
            mem[L.done:L.done + p.max_chunks] = 0
        if meta is None:
            build_table(mem, L.nchunks, L.start, L.len, L.slot, L.sorted, ids, T, tps, N, p.max_chunks, rng)
        mem[2] = 1  # release

    def shrink(c: int, k: int, h_per_slice: int) -> None:
        smem = np.full(smem_words, np.nan, np.float32)
        start, count, slot = (int(ld(tab, w + c)) for w in tw[:3])
        tok = ld(tab, tw[3] + start + tid[:count])
        rp = 1
        while rp < R:
            rp <<= 1
        r, hsub, nsub = tid % rp, tid // rp, THREADS // rp
        acc = np.zeros((THREADS, G), np.float32)
        a_s = slot * H * R
        h_begin, h_end = k * h_per_slice, min(H, k * h_per_slice + h_per_slice)
        tile_shift = p.tile.bit_length() - 1  # __ffs(tile) - 1: tile is a power of two
        assert 1 << tile_shift == p.tile
        vec4 = H % 4 == 0  # NumPy buffers are aligned: the address test of kernel.cu holds
        for h0 in range(h_begin, h_end, p.tile):
            hn = min(p.tile, h_end - h0)
            if vec4:  # 4 elements per load; row and column by shifts
                i = np.arange(count * (p.tile >> 2))
                g = i >> (tile_shift - 2)
                h = (i - (g << (tile_shift - 2))) << 2
                base = tok[g] * H + h0 + h
                inb = h < hn
                assert hn % 4 == 0 and (base[inb] % 4 == 0).all() and (h[inb] + 3 < hn).all(), "unaligned vec4 load"
                for e in range(4):
                    xv = ld(x, np.where(inb, base + e, 0)).astype(f32)
                    st(smem, (g << tile_shift) + h + e, np.where(inb, xv, f32(0)))
            else:
                i = np.arange(count * p.tile)
                g = i >> tile_shift
                h = i - (g << tile_shift)
                xv = ld(x, np.where(h < hn, tok[g] * H + h0 + np.minimum(h, hn - 1), 0)).astype(f32)
                st(smem, i, np.where(h < hn, xv, f32(0)))
            # kernel.cu batches these rows 4 at a time (4 A loads, then their FMAs in row order) with a one-row
            # tail: per accumulator the same sequence of FMAs as this row-by-row loop
            for m in range(-(-p.tile // nsub)):
                hh = hsub + m * nsub
                on = (r < R) & (hh < hn)
                av = ld(a, np.where(on, a_s + (h0 + hh) * R + r, 0)).astype(f32)
                for gg in range(count):
                    xs = ld(smem, np.where(on, gg * p.tile + hh, 0))
                    acc[:, gg] = np.where(on, acc[:, gg] + xs * av, acc[:, gg])
        for gg in range(G):  # red[(hsub * G + g) * rp + r] = acc[g]
            st(smem, (hsub * G + gg) * rp + r, acc[:, gg])
        for q in range(0, count * R, THREADS):
            pp = q + tid[tid < count * R - q]
            g, rr = pp // R, pp % R
            s = np.zeros(len(pp), np.float32)
            for j in range(nsub):
                s = s + ld(smem, (j * G + g) * rp + rr)
            st(memf, L.vpart + (k * T + start + g) * R + rr, s)
        mem[L.done + c] += 1  # release

    def expand(c: int, j: int, o_tile: int) -> None:
        start, count, slot = (int(ld(tab, w + c)) for w in tw[:3])
        tok = ld(tab, tw[3] + start + tid[:count])
        scale = f32(ld(scales, slot))
        v = np.full(G * MAXR, np.nan, np.float32)
        pp = np.arange(count * R)
        g, rr = pp // R, pp % R
        s = np.zeros(len(pp), np.float32)
        for kk in range(p.n_hs):
            s = s + ld(memf, L.vpart + (kk * T + start + g) * R + rr)
        st(v, g * MAXR + rr, s * scale)
        b_s = slot * R * Of
        o_end = min(Of, (j + 1) * o_tile)
        for o0 in range(j * o_tile, o_end, THREADS):
            o = o0 + tid[tid < o_end - o0]
            acc = np.zeros((G, len(o)), np.float32)
            for r_ in range(R):
                bv = ld(b, b_s + r_ * Of + o).astype(f32)
                for gg in range(count):
                    acc[gg] = acc[gg] + ld(v, gg * MAXR + r_) * bv
            for gg in range(count):
                yi = tok[gg] * Of + o
                st(dst, yi, (ld(y, yi).astype(f32) + acc[gg]).astype(dt))

    def wait(pred) -> Generator:  # type: ignore[no-untyped-def]  # lora_spin_until
        while not pred():
            yield pred

    def copy(b: int) -> None:  # lora_copy: rows of tokens without an adapter, y -> out
        for t in range(b, T, p.n_copy):
            if int(ld(ids, t // tps)) in range(N):
                continue
            o = np.arange(Of)
            st(dst, t * Of + o, ld(y, t * Of + o))

    def block() -> Generator:
        ticket = int(mem[0])  # atomicAdd(&ctrl[0], 1)
        mem[0] += 1
        yield None
        if ticket == 0:
            sort()
        elif ticket - 1 >= n_work:
            copy(ticket - 1 - n_work)
        else:
            yield from wait(lambda: mem[2] >= 1)
            n_chunks = int(tab[tw[4]])
            i = ticket - 1
            if i < n_shrink:
                c, k = divmod(i, p.n_hs)
                h_per_slice = ((H + p.n_hs - 1) // p.n_hs + p.tile - 1) // p.tile * p.tile
                if c < n_chunks and k * h_per_slice < H:
                    shrink(c, k, h_per_slice)
                elif c < n_chunks:
                    mem[L.done + c] += 1  # empty H slice still counts as done
            else:
                e = i - n_shrink
                c, j = divmod(e, p.n_ot)
                o_tile = ((Of + p.n_ot - 1) // p.n_ot + 31) // 32 * 32
                if c < n_chunks and j * o_tile < Of:
                    yield from wait(lambda: mem[L.done + c] >= p.n_hs)
                    expand(c, j, o_tile)
        last = int(mem[1]) == p.grid[0] - 1  # atomicAdd(&ctrl[1], 1) == gridDim.x - 1
        mem[1] += 1
        if last:
            if old_reset:  # the pre-fix kernel zeroed this launch's chunk_done here instead of in the sort
                mem[L.done:L.done + p.max_chunks] = 0
            mem[0:4] = 0

    # Scheduler: fill free residency first (each start takes the next ticket), then advance the newest block whose
    # wait condition holds. A consumer thus runs the moment its flag allows it.
    running: list[list] = []
    unstarted = p.grid[0]
    while running or unstarted:
        if unstarted and len(running) < resident:
            gen = block()
            next(gen)
            running.append([gen, None])
            unstarted -= 1
            continue
        for item in reversed(running):
            if item[1] is None or item[1]():
                try:
                    item[1] = next(item[0])
                except StopIteration:
                    running.remove(item)
                break
        else:
            pytest.fail(f"deadlock: {len(running)} resident blocks all waiting, {unstarted} not started")


def simple_launch(x, y, out, a, b, ids, scales, tps, f, dt) -> None:  # type: ignore[no-untyped-def]
    """lora_simple_*: grid (T, ceil(O / o_tile)); out may be y."""
    T, H, Of, R, N = len(y) // f.out_features, f.in_features, f.out_features, f.max_rank, f.num_slots
    p = plan_simple(f, T, dt)
    o_tile = simple_o_tile(Of)
    assert p.grid[0] == T and p.grid[1] * o_tile >= Of and p.grid[1] <= 65535
    for t in range(p.grid[0]):
        for by in range(p.grid[1]):
            o0, o1 = by * o_tile, min(Of, by * o_tile + o_tile)
            slot = int(ld(ids, t // tps))
            o = np.arange(o0, o1)
            if slot < 0 or slot >= N:
                if out is not y:
                    st(out, t * Of + o, ld(y, t * Of + o))
                continue
            rp = 1
            while rp < R:
                rp <<= 1
            r, hsub, nsub = tid % rp, tid // rp, THREADS // rp
            acc = np.zeros(THREADS, np.float32)
            for h0 in range(0, H, nsub):
                h = hsub + h0
                on = (r < R) & (h < H)
                xv = ld(x, np.where(on, t * H + h, 0)).astype(f32)
                av = ld(a, np.where(on, slot * H * R + h * R + r, 0)).astype(f32)
                acc = np.where(on, acc + xv * av, acc)
            red = acc
            v = np.full(MAXR, np.nan, np.float32)
            s = np.zeros(R, np.float32)
            for j in range(nsub):
                s = s + ld(red, j * rp + tid[:R])
            v[:R] = s * f32(ld(scales, slot))
            acc_o = np.zeros(len(o), np.float32)
            for rr in range(R):
                acc_o = acc_o + v[rr] * ld(b, slot * R * Of + rr * Of + o).astype(f32)
            st(out, t * Of + o, (ld(y, t * Of + o).astype(f32) + acc_o).astype(y.dtype))


# --- cases ------------------------------------------------------------------------------------------------------


def make_case(tokens: int, h: int, o: int, max_rank: int, rank: int, n: int, dt: str, seed: int, per_seq: int = 0):
    """Random op inputs in dtype ``dt``; adapters of rank ``rank`` zero-padded to ``max_rank``; slot ids include -1
    and (per token) an out-of-range id, which the kernels treat as no adapter."""
    g = np.random.default_rng(seed)
    d = DTYPES[dt]
    x_shape = (tokens // per_seq, per_seq, h) if per_seq else (tokens, h)
    a = np.zeros((n, h, max_rank))
    b = np.zeros((n, max_rank, o))
    a[:, :, :rank] = g.standard_normal((n, h, rank)) / np.sqrt(h)
    b[:, :rank] = g.standard_normal((n, rank, o)) / np.sqrt(rank)
    ids = g.integers(-1, n, size=x_shape[:1] if per_seq else (tokens,)).astype(np.int32)
    return dict(x=g.standard_normal(x_shape).astype(d), y=g.standard_normal((*x_shape[:-1], o)).astype(d),
                a=a.astype(d), b=b.astype(d), ids=ids, scales=g.uniform(0.5, 2, n).astype(np.float32),
                fields=spec.LoraFields(max_rank, n, h, o, spec.DEFAULT_TILE))


def check(case: dict, got: np.ndarray, dt: str, ids_used: np.ndarray) -> None:
    """Against the float64 reference on the inputs as stored; slot -1 (or out of range) rows keep y's bits."""
    x, y = case["x"], case["y"]
    ok_ids = np.where((ids_used >= 0) & (ids_used < case["fields"].num_slots), ids_used, -1)
    upd = reference.lora_update(x.astype(np.float64), case["a"].astype(np.float64), case["b"].astype(np.float64),
                                ok_ids, case["scales"])
    want = y.astype(np.float64) + upd
    got = got.reshape(want.shape)
    off = reference.expand_slots(ok_ids, x.shape) < 0
    assert np.array_equal(got[off].view(np.uint8), y[off].view(np.uint8)), "rows without adapter must keep y's bits"
    got64 = got.astype(np.float64)
    assert np.isfinite(got64).all(), "NaN: a read of shared memory no thread wrote, or of a stale buffer"
    rms = float(np.sqrt(np.mean(upd**2))) if upd.size else 0.0
    bound = EPS[dt] * np.abs(want) + 1e-5 * (rms + 1.0)
    worst = float(np.max(np.abs(got64 - want) / bound))
    assert worst <= 1.0, f"max error {worst:.2f}x the bound (dtype {dt})"
