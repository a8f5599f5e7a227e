// LoRAOpPluginDynamic: fused multi-adapter LoRA update, y[t] += scales[s] * (x[t] @ A[s]) @ B[s], s = slot of token t.
//
// One launch, three kinds of blocks (see README.md "Kernel design"). Every block takes a ticket from an atomic
// counter; tickets, not blockIdx, decide the role, and a block only ever waits for blocks holding smaller tickets.
// A block holding a ticket has executed its atomicAdd, so it is resident and never waits on a larger ticket: no
// deadlock whatever order the hardware dispatches blocks in (no in-order-dispatch assumption, unlike look-back
// schemes keyed on blockIdx), and no cooperative launch. The one assumption is the one every single-pass scan makes:
// a resident block keeps being scheduled while other resident blocks spin (true of NVIDIA GPUs; the spin sleeps).
//   ticket 0                      SORT:   counting sort of the tokens by slot (slot -1 dropped) into chunks of
//                                         LORA_TOKENS tokens of one slot; publishes the chunk table.
//   tickets 1 .. C*n_hs           SHRINK: chunk c, H slice k: partial v[k][pos][r] = x[tok] . A[s][h in slice k][r]
//   the next C*n_ot tickets       EXPAND: chunk c, O tile j: waits for c's n_hs shrink slices, v = scale * sum_k,
//                                         out[tok][o] = y[tok][o] + v . B[s][:, o] for o in tile j.
//   the last n_copy tickets       COPY:   (out != y only) rows of tokens without an adapter, y -> out; no waiting.
// So an out-of-place launch needs no y -> out copy before it (issue 17 item 4): y is read once, out written once.
// Grouping tokens by slot makes each block read A[s] / B[s] once for up to LORA_TOKENS tokens, so at 2048 tokens
// the adapter pools cost ~(T/16 + N) * (H*R + R*O) L2 bytes instead of T * (H*R + R*O); splitting H (shrink) and O
// (expand) across blocks keeps small batches parallel. Tokens with slot -1 are never touched (y passes through).
// Sort once per forward (issue 17 item 5): all LoRA nodes of a forward share slot_ids, so `lora_prepare` (one
// block) can build the token order and chunk table once into a metadata buffer (`meta`) that every node's launch
// reads; a fused launch with meta != 0 skips its own sort (its ticket-0 block only zeroes the chunk counters).
// Scratch state across launches: only ctrl[0..3] (fixed words at the start of the scratch, whatever T is) must be
// zero when a launch starts; the last block to finish zeroes them again, so the scratch needs zeroing only once (at
// allocation) and CUDA-graph replays work. The chunk_done counters are zeroed by the SORT block before it publishes
// the chunk table (their position depends on T, so a previous launch of another size leaves other data there).
// Accumulation is fp32; y is read and rounded once.
//
// No CUDA headers: fp16/bf16 conversions are inline PTX, so NVRTC needs no include path. Needs sm_80+ (bf16 cvt).

#define LORA_THREADS 256
#define LORA_TOKENS 16
#define LORA_MAX_RANK 64
#define LORA_WARPS (LORA_THREADS / 32)
#define LORA_SPIN_LIMIT (1u << 25)  // ~8 s of 256 ns sleeps: a bug, never a legitimate wait
#define LORA_SORT_UNROLL 8           // slot ids loaded per thread before use (one memory latency per 2048 tokens)
#define LORA_META_WORDS 4            // metadata header: meta[0] = number of chunks (meta[1..3] unused, alignment)

struct lora_f16 { unsigned short bits; };
struct lora_bf16 { unsigned short bits; };
template <typename T> struct alignas(4 * sizeof(T)) lora_vec4 { T v[4]; };  // one 8- or 16-byte load

__device__ __forceinline__ float lora_to_f(float v) { return v; }
__device__ __forceinline__ float lora_to_f(lora_f16 v) {
    float f;
    asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(v.bits));
    return f;
}
__device__ __forceinline__ float lora_to_f(lora_bf16 v) { return __uint_as_float(((unsigned int)v.bits) << 16); }

template <typename T> __device__ __forceinline__ T lora_from_f(float f);
template <> __device__ __forceinline__ float lora_from_f<float>(float f) { return f; }
template <> __device__ __forceinline__ lora_f16 lora_from_f<lora_f16>(float f) {
    lora_f16 r;
    asm("{ .reg .b16 h; cvt.rn.f16.f32 h, %1; mov.b16 %0, h; }" : "=h"(r.bits) : "f"(f));
    return r;
}
template <> __device__ __forceinline__ lora_bf16 lora_from_f<lora_bf16>(float f) {
    lora_bf16 r;
    asm("{ .reg .b16 h; cvt.rn.bf16.f32 h, %1; mov.b16 %0, h; }" : "=h"(r.bits) : "f"(f));
    return r;
}

// Scratch layout (int32 words; the launcher allocates scratch_bytes() and zeroes it once):
//   ctrl[0] ticket   ctrl[1] blocks done   ctrl[2] chunk table ready   ctrl[3] number of chunks
//   (ctrl[0..3] are zero between launches; everything below is written before it is read in each launch)
//   chunk_done[max_chunks]  chunk_start[max_chunks]  chunk_len[max_chunks]  chunk_slot[max_chunks]
//   sorted[num_tokens]      then (float) vpart[n_hs][num_tokens][rank]
// Metadata buffer (lora_prepare's output, meta_bytes() in launch.py): meta[0] = number of chunks, then from word
// LORA_META_WORDS the same chunk_start / chunk_len / chunk_slot [max_chunks] and sorted[num_tokens] tables. With a
// metadata buffer the scratch keeps its layout (vpart stays where it is); its table words are then unused.
struct LoraScratch {
    int* ctrl; int* chunk_done; int* n_chunks; int* chunk_start; int* chunk_len; int* chunk_slot; int* sorted;
    float* vpart;
};

__device__ __forceinline__ void lora_tables(LoraScratch& s, int* table, int max_chunks) {
    s.chunk_start = table;
    s.chunk_len = table + max_chunks;
    s.chunk_slot = table + 2 * max_chunks;
    s.sorted = table + 3 * max_chunks;
}

// base = the scratch (may be null for lora_prepare); meta = a forward's metadata buffer or null (tables in scratch)
__device__ __forceinline__ LoraScratch lora_scratch(int* base, int* meta, int max_chunks, int num_tokens) {
    LoraScratch s;
    s.ctrl = base;
    s.chunk_done = base + 4;
    s.n_chunks = meta ? meta : base + 3;
    lora_tables(s, meta ? meta + LORA_META_WORDS : s.chunk_done + max_chunks, max_chunks);
    s.vpart = reinterpret_cast<float*>(base + 4 + 4 * max_chunks + num_tokens);
    return s;
}

__device__ __forceinline__ int lora_load_volatile(const int* p) { return *((volatile const int*)p); }

// Release: every thread's global writes, then the flag. The barrier orders the block's writes before thread 0's
// fence, and a GPU-scope fence is cumulative (PTX memory model), so one fence by thread 0 before the atomic
// publishes them all: cooperative groups' grid.sync() pattern. Must be called by all threads of the block.
__device__ __forceinline__ void lora_release_add(int* flag, int value) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(flag, value);
    }
}
__device__ __forceinline__ void lora_release(int* flag, int value) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicExch(flag, value);
    }
}

// Acquire (thread 0 only; the caller then syncs the block): spin with volatile (L1-bypassing) loads until *p >= value,
// then fence so later loads (ld.global.cg by any thread after the barrier) see the producers' writes.
__device__ __forceinline__ void lora_spin_until(const int* p, int value) {
    unsigned int spins = 0, sleep_ns = 32;
    while (lora_load_volatile(p) < value) {
        if (++spins > LORA_SPIN_LIMIT) __trap();  // a bug, never a hang: turn it into a launch error
        __nanosleep(sleep_ns);  // back off (32 -> 256 ns) so hundreds of waiting blocks do not flood one L2 slice
        if (sleep_ns < 256) sleep_ns <<= 1;
    }
    __threadfence();
}

// Slot of token t, or -1 when t is past the end or its id is outside [0, num_slots) (no adapter).
__device__ __forceinline__ int lora_slot_of(const int* __restrict__ slot_ids, int t, int num_tokens,
                                            int tokens_per_slot, int num_slots) {
    const int s = t < num_tokens ? slot_ids[t / tokens_per_slot] : -1;
    return (s >= 0 && s < num_slots) ? s : -1;
}

// Chunk table and token order of one forward (one block; the caller publishes them). Warp-aggregated shared
// atomics (__match_any_sync) keep 8 hot slots from serializing. Token t = t0 + u * LORA_THREADS + tid; the
// LORA_SORT_UNROLL loads of a batch are issued before any is used. The prefix over the slots is parallel: thread tid
// owns slots [tid * per, (tid + 1) * per) and a block scan of the per-thread token and chunk counts gives each its
// offsets (a serial loop over 4096 slots by one thread cost 70-100 us).
__device__ void lora_build_table(const int* __restrict__ slot_ids, int num_tokens, int tokens_per_slot,
                                 int num_slots, LoraScratch sc, int* hist /* shared, 2*num_slots ints */) {
    const int tid = threadIdx.x, lane = tid & 31;
    __shared__ int scan_tok[LORA_THREADS], scan_chk[LORA_THREADS];
    int* cursor = hist + num_slots;
    for (int s = tid; s < num_slots; s += LORA_THREADS) hist[s] = 0;
    __syncthreads();
    for (int t0 = 0; t0 < num_tokens; t0 += LORA_THREADS * LORA_SORT_UNROLL) {
        int s[LORA_SORT_UNROLL];
#pragma unroll
        for (int u = 0; u < LORA_SORT_UNROLL; ++u)
            s[u] = lora_slot_of(slot_ids, t0 + u * LORA_THREADS + tid, num_tokens, tokens_per_slot, num_slots);
#pragma unroll
        for (int u = 0; u < LORA_SORT_UNROLL; ++u) {
            const unsigned peers = __match_any_sync(0xffffffffu, s[u]);
            if (s[u] >= 0 && (__ffs(peers) - 1) == lane) atomicAdd(&hist[s[u]], __popc(peers));
        }
    }
    __syncthreads();
    const int per = (num_slots + LORA_THREADS - 1) / LORA_THREADS;
    const int s0 = min(num_slots, tid * per), s1 = min(num_slots, s0 + per);
    int nt = 0, nc = 0;
    for (int s = s0; s < s1; ++s) {
        const int n = hist[s];
        nt += n;
        nc += (n + LORA_TOKENS - 1) / LORA_TOKENS;
    }
    scan_tok[tid] = nt;
    scan_chk[tid] = nc;
    __syncthreads();
    for (int d = 1; d < LORA_THREADS; d <<= 1) {  // inclusive Hillis-Steele scan, 8 steps
        const int at = tid >= d ? scan_tok[tid - d] : 0, ac = tid >= d ? scan_chk[tid - d] : 0;
        __syncthreads();
        scan_tok[tid] += at;
        scan_chk[tid] += ac;
        __syncthreads();
    }
    int off = scan_tok[tid] - nt, c = scan_chk[tid] - nc;
    for (int s = s0; s < s1; ++s) {
        const int n = hist[s];
        cursor[s] = off;
        for (int i = 0; i < n; i += LORA_TOKENS, ++c) {
            sc.chunk_start[c] = off + i;
            sc.chunk_len[c] = min(LORA_TOKENS, n - i);
            sc.chunk_slot[c] = s;
        }
        off += n;
    }
    if (tid == LORA_THREADS - 1) *sc.n_chunks = scan_chk[tid];
    __syncthreads();
    for (int t0 = 0; t0 < num_tokens; t0 += LORA_THREADS * LORA_SORT_UNROLL) {
        int s[LORA_SORT_UNROLL];
#pragma unroll
        for (int u = 0; u < LORA_SORT_UNROLL; ++u)
            s[u] = lora_slot_of(slot_ids, t0 + u * LORA_THREADS + tid, num_tokens, tokens_per_slot, num_slots);
#pragma unroll
        for (int u = 0; u < LORA_SORT_UNROLL; ++u) {
            const unsigned peers = __match_any_sync(0xffffffffu, s[u]);
            const int leader = __ffs(peers) - 1;
            int base = 0;
            if (s[u] >= 0 && leader == lane) base = atomicAdd(&cursor[s[u]], __popc(peers));
            base = __shfl_sync(0xffffffffu, base, leader);
            if (s[u] >= 0) sc.sorted[base + __popc(peers & ((1u << lane) - 1u))] = t0 + u * LORA_THREADS + tid;
        }
    }
}

// SORT role (ticket 0): zero this launch's chunk counters, build the table unless a forward's metadata buffer
// already holds it, publish.
__device__ void lora_sort(const int* __restrict__ slot_ids, int num_tokens, int tokens_per_slot, int num_slots,
                          int max_chunks, LoraScratch sc, bool presorted, int* hist) {
    for (int c = threadIdx.x; c < max_chunks; c += LORA_THREADS) sc.chunk_done[c] = 0;  // published below
    if (!presorted) lora_build_table(slot_ids, num_tokens, tokens_per_slot, num_slots, sc, hist);
    lora_release(&sc.ctrl[2], 1);
}

// SHRINK role: chunk c, H slice k. Thread (r = tid % rp, hsub = tid / rp) sums rows hsub, hsub + LORA_THREADS/rp,
// ... of each staged x tile for all tokens of the chunk; the hsub partials are then reduced in shared memory.
template <typename T>
__device__ void lora_shrink(const T* __restrict__ x, const T* __restrict__ lora_a, int in_features, int rank,
                            int tile, int h_per_slice, int num_tokens, int c, int k, LoraScratch sc, float* smem) {
    const int tid = threadIdx.x;
    __shared__ int tok[LORA_TOKENS];
    const int start = __ldcg(sc.chunk_start + c), count = __ldcg(sc.chunk_len + c), slot = __ldcg(sc.chunk_slot + c);
    if (tid < count) tok[tid] = __ldcg(sc.sorted + start + tid);
    int rp = 1;
    while (rp < rank) rp <<= 1;
    const int r = tid % rp, hsub = tid / rp, nsub = LORA_THREADS / rp;
    float acc[LORA_TOKENS];
#pragma unroll
    for (int g = 0; g < LORA_TOKENS; ++g) acc[g] = 0.f;
    const T* a_s = lora_a + (size_t)slot * in_features * rank;
    const int h_begin = k * h_per_slice, h_end = min(in_features, h_begin + h_per_slice);
    float* xs = smem;  // [LORA_TOKENS][tile]
    __syncthreads();
    // x staging: 4 elements per load (8 or 16 bytes) when every row start is 4-aligned (H % 4 == 0, x aligned);
    // tile is a power of two (32..256), so row/column come from shifts, not an integer division per element
    const int tile_shift = __ffs(tile) - 1;
    const bool vec4 = (in_features & 3) == 0 && (reinterpret_cast<size_t>(x) & (4 * sizeof(T) - 1)) == 0;
    for (int h0 = h_begin; h0 < h_end; h0 += tile) {
        const int hn = min(tile, h_end - h0);
        if (vec4) {  // hn is a multiple of 4 here: h0, h_end and H are
            for (int i = tid; i < count * (tile >> 2); i += LORA_THREADS) {
                const int g = i >> (tile_shift - 2), h = (i - (g << (tile_shift - 2))) << 2;
                float* dst = xs + (g << tile_shift) + h;
                if (h < hn) {
                    const lora_vec4<T> v =
                        *reinterpret_cast<const lora_vec4<T>*>(x + (size_t)tok[g] * in_features + h0 + h);
#pragma unroll
                    for (int e = 0; e < 4; ++e) dst[e] = lora_to_f(v.v[e]);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) dst[e] = 0.f;
                }
            }
        } else {
            for (int i = tid; i < count * tile; i += LORA_THREADS) {
                const int g = i >> tile_shift, h = i - (g << tile_shift);
                xs[i] = h < hn ? lora_to_f(x[(size_t)tok[g] * in_features + h0 + h]) : 0.f;
            }
        }
        __syncthreads();
        if (r < rank) {
            // 4 A loads in flight before their FMAs (one memory latency per 4 rows, not per row); same summation
            // order as the one-row loop, so results are unchanged
            int h = hsub;
            for (; h + 3 * nsub < hn; h += 4 * nsub) {
                float a4[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) a4[u] = lora_to_f(a_s[(size_t)(h0 + h + u * nsub) * rank + r]);
#pragma unroll
                for (int u = 0; u < 4; ++u)
#pragma unroll
                    for (int g = 0; g < LORA_TOKENS; ++g)
                        if (g < count) acc[g] += xs[g * tile + h + u * nsub] * a4[u];
            }
            for (; h < hn; h += nsub) {
                const float a = lora_to_f(a_s[(size_t)(h0 + h) * rank + r]);
#pragma unroll
                for (int g = 0; g < LORA_TOKENS; ++g)
                    if (g < count) acc[g] += xs[g * tile + h] * a;
            }
        }
        __syncthreads();
    }
    float* red = smem;  // [nsub][LORA_TOKENS][rp] = LORA_THREADS * LORA_TOKENS floats
#pragma unroll
    for (int g = 0; g < LORA_TOKENS; ++g) red[(hsub * LORA_TOKENS + g) * rp + r] = acc[g];
    __syncthreads();
    float* vpart = sc.vpart + (size_t)k * num_tokens * rank;
    for (int p = tid; p < count * rank; p += LORA_THREADS) {
        const int g = p / rank, rr = p - g * rank;
        float s = 0.f;
        for (int j = 0; j < nsub; ++j) s += red[(j * LORA_TOKENS + g) * rp + rr];
        vpart[(size_t)(start + g) * rank + rr] = s;
    }
    lora_release_add(&sc.chunk_done[c], 1);
}

// EXPAND role: chunk c, O tile j: v = scale * sum_k vpart (fp32, in shared memory), then for each column o of the
// tile (one per thread at a time, coalesced): acc[g] = sum_r v[g][r] * B[s][r][o] for the chunk's tokens, and
// y[tok][o] += acc[g]. Each B element is loaded once per block and reused for all tokens of the chunk.
template <typename T>
__device__ void lora_expand(const T* y, T* out, const T* __restrict__ lora_b, const float* __restrict__ scales,
                            int out_features, int rank, int n_hs, int o_tile, int num_tokens, int c, int j,
                            LoraScratch sc) {
    const int tid = threadIdx.x;
    __shared__ int tok[LORA_TOKENS];
    __shared__ float v[LORA_TOKENS * LORA_MAX_RANK];
    if (tid == 0) lora_spin_until(&sc.chunk_done[c], n_hs);
    __syncthreads();
    const int start = __ldcg(sc.chunk_start + c), count = __ldcg(sc.chunk_len + c), slot = __ldcg(sc.chunk_slot + c);
    if (tid < count) tok[tid] = __ldcg(sc.sorted + start + tid);
    const float scale = scales[slot];
    for (int p = tid; p < count * rank; p += LORA_THREADS) {
        const int g = p / rank, rr = p - g * rank;
        float s = 0.f;
        for (int k = 0; k < n_hs; ++k)  // written by other blocks in this launch: bypass L1 (ld.global.cg)
            s += __ldcg(sc.vpart + ((size_t)k * num_tokens + start + g) * rank + rr);
        v[g * LORA_MAX_RANK + rr] = s * scale;
    }
    __syncthreads();
    const T* b_s = lora_b + (size_t)slot * rank * out_features;
    const int o_end = min(out_features, (j + 1) * o_tile);
    for (int o = j * o_tile + tid; o < o_end; o += LORA_THREADS) {
        float acc[LORA_TOKENS];
#pragma unroll
        for (int g = 0; g < LORA_TOKENS; ++g) acc[g] = 0.f;
#pragma unroll 4
        for (int rr = 0; rr < rank; ++rr) {
            const float b = lora_to_f(b_s[(size_t)rr * out_features + o]);
#pragma unroll
            for (int g = 0; g < LORA_TOKENS; ++g)
                if (g < count) acc[g] += v[g * LORA_MAX_RANK + rr] * b;
        }
        // the chunk's y loads all in flight together (one memory latency per column, not a load/store chain per
        // token): y is not __restrict__-proven apart from itself across tokens, so the loads are batched by hand
#pragma unroll
        for (int g = 0; g < LORA_TOKENS; ++g)
            if (g < count) acc[g] += lora_to_f(y[(size_t)tok[g] * out_features + o]);
#pragma unroll
        for (int g = 0; g < LORA_TOKENS; ++g)
            if (g < count) out[(size_t)tok[g] * out_features + o] = lora_from_f<T>(acc[g]);
    }
}

// COPY role (out of place only): copy block b of n_copy copies the rows of tokens b, b + n_copy, ... that have no
// adapter (slot -1 or out of range) from y to out, bit for bit; the expand blocks write every other row.
template <typename T>
__device__ void lora_copy(const T* y, T* out, const int* __restrict__ slot_ids, int num_tokens, int out_features,
                          int num_slots, int tokens_per_slot, int b, int n_copy) {
    for (int t = b; t < num_tokens; t += n_copy) {
        if (lora_slot_of(slot_ids, t, num_tokens, tokens_per_slot, num_slots) >= 0) continue;
        const T* yr = y + (size_t)t * out_features;
        T* outr = out + (size_t)t * out_features;
        for (int o = threadIdx.x; o < out_features; o += LORA_THREADS) outr[o] = yr[o];
    }
}

template <typename T>
__device__ void lora_fused(const T* __restrict__ x, const T* y, const T* __restrict__ lora_a,
                           const T* __restrict__ lora_b, const int* __restrict__ slot_ids,
                           const float* __restrict__ scales, int* __restrict__ scratch, int* meta, T* out,
                           int num_tokens, int in_features, int out_features, int rank, int num_slots,
                           int tokens_per_slot, int tile, int n_hs, int n_ot, int max_chunks, int n_copy) {
    extern __shared__ float smem[];
    __shared__ int ticket_s, last_s;
    const LoraScratch sc = lora_scratch(scratch, meta, max_chunks, num_tokens);
    if (threadIdx.x == 0) ticket_s = atomicAdd(&sc.ctrl[0], 1);
    __syncthreads();
    const int ticket = ticket_s;
    const int n_shrink = max_chunks * n_hs, n_work = n_shrink + max_chunks * n_ot;
    if (ticket == 0) {
        lora_sort(slot_ids, num_tokens, tokens_per_slot, num_slots, max_chunks, sc, meta != nullptr,
                  reinterpret_cast<int*>(smem));
    } else if (ticket - 1 >= n_work) {
        lora_copy<T>(y, out, slot_ids, num_tokens, out_features, num_slots, tokens_per_slot, ticket - 1 - n_work,
                     n_copy);
    } else {
        if (threadIdx.x == 0) lora_spin_until(&sc.ctrl[2], 1);
        __syncthreads();
        const int n_chunks = lora_load_volatile(sc.n_chunks);
        const int i = ticket - 1;
        if (i < n_shrink) {
            const int c = i / n_hs, k = i - c * n_hs;
            const int h_per_slice = ((in_features + n_hs - 1) / n_hs + tile - 1) / tile * tile;
            if (c < n_chunks && k * h_per_slice < in_features)
                lora_shrink<T>(x, lora_a, in_features, rank, tile, h_per_slice, num_tokens, c, k, sc, smem);
            else if (c < n_chunks && threadIdx.x == 0)
                atomicAdd(&sc.chunk_done[c], 1);  // empty H slice still counts as done
        } else {
            const int e = i - n_shrink, c = e / n_ot, j = e - c * n_ot;
            const int o_tile = ((out_features + n_ot - 1) / n_ot + 31) / 32 * 32;
            if (c < n_chunks && j * o_tile < out_features)
                lora_expand<T>(y, out, lora_b, scales, out_features, rank, n_hs, o_tile, num_tokens, c, j, sc);
        }
    }
    // The last block out resets the control words for the next launch (same stream => launches do not overlap).
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last_s = atomicAdd(&sc.ctrl[1], 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (last_s && threadIdx.x == 0) {  // every other block is past its last scratch access (it counted itself)
        sc.ctrl[0] = 0; sc.ctrl[2] = 0; sc.ctrl[3] = 0; sc.ctrl[1] = 0;
        __threadfence();
    }
}

// SIMPLE variant (no scratch, out-of-place allowed): one block per (token, O tile); each block recomputes its
// token's rank-R shrink (x row and A[s] slices stay in L2 across the O tiles). Used by the ahead-of-time TensorRT
// plugin, which can pass only tensors and int32 scalars (no persistent scratch), and as a cross-check in tests.
// Tokens with slot -1 copy y to out (a no-op when out == y).
template <typename T>
__device__ void lora_simple(const T* __restrict__ x, const T* y, const T* __restrict__ lora_a,
                            const T* __restrict__ lora_b, const int* __restrict__ slot_ids,
                            const float* __restrict__ scales, T* out, int in_features, int out_features, int rank,
                            int num_slots, int tokens_per_slot, int o_tile) {
    __shared__ float red[LORA_THREADS];
    __shared__ float v[LORA_MAX_RANK];
    // tokens on grid x (up to 2^31 - 1), O tiles on grid y (<= 65535: O / o_tile is small)
    const int tid = threadIdx.x, t = blockIdx.x;
    const int o0 = blockIdx.y * o_tile, o1 = min(out_features, o0 + o_tile);
    const int slot = slot_ids[t / tokens_per_slot];
    const T* yr = y + (size_t)t * out_features;
    T* outr = out + (size_t)t * out_features;
    if (slot < 0 || slot >= num_slots) {
        if (outr != yr)
            for (int o = o0 + tid; o < o1; o += LORA_THREADS) outr[o] = yr[o];
        return;
    }
    int rp = 1;
    while (rp < rank) rp <<= 1;
    const int r = tid % rp, hsub = tid / rp, nsub = LORA_THREADS / rp;
    const T* xr = x + (size_t)t * in_features;
    const T* a_s = lora_a + (size_t)slot * in_features * rank;
    float acc = 0.f;
    if (r < rank) {
#pragma unroll 8
        for (int h = hsub; h < in_features; h += nsub) acc += lora_to_f(xr[h]) * lora_to_f(a_s[(size_t)h * rank + r]);
    }
    red[tid] = acc;
    __syncthreads();
    if (tid < rank) {
        float s = 0.f;
        for (int j = 0; j < nsub; ++j) s += red[j * rp + tid];
        v[tid] = s * scales[slot];
    }
    __syncthreads();
    const T* b_s = lora_b + (size_t)slot * rank * out_features;
    for (int o = o0 + tid; o < o1; o += LORA_THREADS) {
        float s = 0.f;
        for (int rr = 0; rr < rank; ++rr) s += v[rr] * lora_to_f(b_s[(size_t)rr * out_features + o]);
        outr[o] = lora_from_f<T>(lora_to_f(yr[o]) + s);
    }
}

#define LORA_SIMPLE_ENTRY(NAME, TYPE)                                                                                 \
    extern "C" __global__ void __launch_bounds__(LORA_THREADS) NAME(                                                 \
        const TYPE* __restrict__ x,         /* [T, H] activations, dtype D */                                       \
        const TYPE* y,                      /* [T, O] projection output, dtype D (may equal out) */                 \
        const TYPE* __restrict__ lora_a,    /* [N, H, R] down-projection pool, dtype D */                           \
        const TYPE* __restrict__ lora_b,    /* [N, R, O] up-projection pool, dtype D */                             \
        const int* __restrict__ slot_ids,   /* [T / tokens_per_slot] int32, slot in [0, N) or -1 */                 \
        const float* __restrict__ scales,   /* [N] float32 */                                                       \
        TYPE* out,                          /* [T, O] output, dtype D (may equal y) */                              \
        int in_features,                    /* H */                                                                 \
        int out_features,                   /* O */                                                                 \
        int rank,                           /* R, 1..64 */                                                          \
        int num_slots,                      /* N */                                                                 \
        int tokens_per_slot,                /* 1 per token, S per sequence */                                       \
        int o_tile) {                       /* output columns per block; grid = (T, ceil(O / o_tile)) */            \
        lora_simple<TYPE>(x, y, lora_a, lora_b, slot_ids, scales, out, in_features, out_features, rank, num_slots,  \
                          tokens_per_slot, o_tile);                                                                 \
    }

LORA_SIMPLE_ENTRY(lora_simple_f16, lora_f16)
LORA_SIMPLE_ENTRY(lora_simple_bf16, lora_bf16)
LORA_SIMPLE_ENTRY(lora_simple_f32, float)

// Entry points, one per dtype (extern "C": stable PTX names lora_fused_f16 / lora_fused_bf16 / lora_fused_f32).
// Parameters (T = num_tokens = product of x.shape[:-1]; H = in_features; O = out_features; R = rank; N = num_slots):
#define LORA_ENTRY(NAME, TYPE)                                                                                        \
    extern "C" __global__ void __launch_bounds__(LORA_THREADS, 2) NAME(                                                 \
        const TYPE* __restrict__ x,         /* [T, H] activations, dtype D, row-major */                            \
        const TYPE* y,                      /* [T, O] projection output, dtype D (may equal out) */                 \
        const TYPE* __restrict__ lora_a,    /* [N, H, R] down-projection pool, dtype D */                           \
        const TYPE* __restrict__ lora_b,    /* [N, R, O] up-projection pool, dtype D */                             \
        const int* __restrict__ slot_ids,   /* [T / tokens_per_slot] int32, slot in [0, N) or -1 (no adapter) */    \
        const float* __restrict__ scales,   /* [N] float32, alpha / rank per slot */                                \
        int* __restrict__ scratch,          /* scratch_bytes() bytes, zeroed once at allocation, int32 words */     \
        int* meta,                          /* null, or this forward's lora_prepare output (meta_bytes() bytes) */   \
        TYPE* out,                          /* [T, O] y + update; == y: in place (then n_copy = 0) */               \
        int num_tokens,                     /* T */                                                                 \
        int in_features,                    /* H */                                                                 \
        int out_features,                   /* O */                                                                 \
        int rank,                           /* R, 1..64 */                                                          \
        int num_slots,                      /* N */                                                                 \
        int tokens_per_slot,                /* 1 per token, S per sequence */                                       \
        int tile,                           /* H elements staged per shared-memory step (the tactic) */             \
        int n_hs,                           /* H slices per chunk (shrink blocks per chunk) */                      \
        int n_ot,                           /* O tiles per chunk (expand blocks per chunk) */                       \
        int max_chunks,                     /* upper bound on chunks: ceil(T / 16) + min(N, T) */                   \
        int n_copy) {                       /* COPY blocks (rows without adapter, y -> out); 0 when out == y */     \
        lora_fused<TYPE>(x, y, lora_a, lora_b, slot_ids, scales, scratch, meta, out, num_tokens, in_features,     \
                         out_features, rank, num_slots, tokens_per_slot, tile, n_hs, n_ot, max_chunks, n_copy);      \
    }

LORA_ENTRY(lora_fused_f16, lora_f16)
LORA_ENTRY(lora_fused_bf16, lora_bf16)
LORA_ENTRY(lora_fused_f32, float)

// Once per forward: the token order and chunk table of slot_ids into `meta` (meta_bytes() bytes), for every fused
// launch of the forward that passes it. One block of LORA_THREADS threads, 8 * num_slots bytes of dynamic shared
// memory; on the same stream before those launches (stream order publishes the writes). No scratch.
extern "C" __global__ void __launch_bounds__(LORA_THREADS) lora_prepare(
    const int* __restrict__ slot_ids,   /* [T / tokens_per_slot] int32 */
    int* __restrict__ meta,             /* output: meta[0] = chunks, tables from word LORA_META_WORDS */
    int num_tokens, int num_slots, int tokens_per_slot,
    int max_chunks) {                   /* ceil(T / 16) + min(N, T), as the fused launches of this T use */
    extern __shared__ int hist[];
    LoraScratch sc;
    sc.ctrl = sc.chunk_done = nullptr;
    sc.vpart = nullptr;
    sc.n_chunks = meta;
    lora_tables(sc, meta + LORA_META_WORDS, max_chunks);
    lora_build_table(slot_ids, num_tokens, tokens_per_slot, num_slots, sc, hist);
}
