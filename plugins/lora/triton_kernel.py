"""The small-batch LoRA kernel in Triton (the language): one launch, no scratch, ``out = y + delta`` written directly.

Grid ``(T, ceil(O / BLOCK_O))``. Program ``(t, j)`` is the *leader* of token t's group when no earlier token has the
same (clamped) slot; other programs return at once. The leader of slot s walks the tokens of s in blocks of
``BLOCK_T`` (from its own block on), recomputes their rank-R shrink ``x @ A[s]`` from L2 (A[s] is H*R elements,
128 KB at H = 4096, R = 16, fp16), and writes ``out = y + scale * shrink @ B[s][:, j-th O block]`` for them, rounded
once (fp32 accumulation). The leader of the "no adapter" group (slot -1 or out of range) copies ``y`` to ``out``
for its tokens (a harmless self-copy when the engine aliases out to y). No sort, no inter-program waits, no
persistent state: CUDA-graph replay and concurrent contexts need nothing.

Why this design (issue 17, item 7): it is the one of the two candidates whose *exact* code runs on this CPU-only
project's CI (Triton's interpreter, ``TRITON_INTERPRET=1``), and ``triton.compile`` builds it for sm_80/86/89/90
without a GPU, so the AOT plugin can embed it. It recomputes the shrink once per O block, so its cost grows as
``T * H * R * ceil(O / BLOCK_O)``: meant for decode (1-128 tokens); large batches use the fused CUDA kernel.

Argument order is TensorRT's AOT convention: the 6 inputs, then the int32 scalars, then the output; the
compile-time sizes are constexprs (``BLOCK_*``, ``DOT_F32``, ``PRECISION``). Triton is imported lazily by ``kernel()``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from trtforge.build_engine.core import env

# Scalars after the 6 input pointers, in the kernel's order (the AOT plugin passes them as extra args).
SCALAR_ARGS: tuple[str, ...] = ("num_tokens", "in_features", "out_features", "rank", "num_slots", "tokens_per_slot")
TRITON_DTYPES: dict[str, str] = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
# fp32 dots (the expand always; the shrink for fp32 inputs) as 3 TF32 tensor-core passes: about fp32 accuracy,
# where "ieee" (the FMA path) spills registers at rank 64 (ptxas -v, sm_80/90)
DOT_PRECISION = "tf32x3"


@dataclass(frozen=True)
class TritonConfig:
    """Compile-time shape of one variant (a plugin tactic)."""

    block_t: int = 16  # tokens per step (tl.dot needs >= 16)
    block_k: int = 64  # H elements per shrink step
    block_o: int = 128  # output columns per program
    num_warps: int = 4

    def effective(self, rank: int, dtype: str) -> TritonConfig:
        """The sizes actually compiled: fp32 operands halve the H step (shared memory), and fp32 at rank > 32 also
        halves the O block, any dtype at rank > 32 too, with 8 warps (the 3-pass TF32 split of the B tile otherwise
        spills registers; ptxas -v)."""
        wide = block_rank(rank) > (16 if dtype == "float32" else 32)
        if dtype != "float32" and not wide:
            return self
        k_div = (2 if dtype == "float32" else 1) * (2 if wide else 1)
        return TritonConfig(self.block_t, max(16, self.block_k // k_div),
                            max(32, self.block_o // 2) if wide else self.block_o, max(self.num_warps, 8 if wide else 4))

    def constexprs(self, rank: int, dtype: str) -> dict[str, Any]:
        e = self.effective(rank, dtype)
        return {"BLOCK_T": e.block_t, "BLOCK_K": e.block_k, "BLOCK_O": e.block_o, "BLOCK_R": block_rank(rank),
                "DOT_F32": int(dtype == "float32"), "UPCAST_BF16": int(dtype == "bfloat16"), "PRECISION": DOT_PRECISION}


SMALL_CONFIGS: tuple[TritonConfig, ...] = (
    TritonConfig(16, 64, 128, 4), TritonConfig(16, 128, 256, 8), TritonConfig(32, 64, 128, 8),
    TritonConfig(64, 64, 64, 8),
)


def block_rank(rank: int) -> int:
    """Rank padded to a power of two >= 16 (tl.dot's smallest tile); padded columns of A / rows of B read as 0."""
    r = 16
    while r < rank:
        r *= 2
    return r


def signature(dtype: str) -> dict[str, str]:
    """``triton.compile`` signature: pointers by element type, scalars as i32, output pointer last."""
    t = "*" + TRITON_DTYPES[dtype]
    sig = {"x": t, "y": t, "lora_a": t, "lora_b": t, "slot_ids": "*i32", "scales": "*fp32"}
    sig.update({name: "i32" for name in SCALAR_ARGS})
    sig["out"] = t
    return sig


@functools.cache
def kernel(interpret: bool = False) -> Any:
    """The ``@triton.jit`` function (built on first use so importing this module needs no Triton).

    ``interpret=True``: the same source decorated under ``TRITON_INTERPRET=1`` (Triton reads it at decoration
    time), to run in Triton's interpreter on the CPU. Triton 3.9 also needs the variable set when it is first
    imported for the interpreter to work, so the CPU tests run it in a child process started with it.
    """
    import triton
    import triton.language as tl

    with env.override(env.TRITON_INTERPRET, "1" if interpret else "0"):
        return _define(triton, tl)


def _define(triton: Any, tl: Any) -> Any:
    @triton.jit  # type: ignore[misc]
    def lora_small(x, y, lora_a, lora_b, slot_ids, scales, num_tokens, in_features, out_features, rank, num_slots,
                   tokens_per_slot, out, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_O: tl.constexpr,
                   BLOCK_R: tl.constexpr, DOT_F32: tl.constexpr, UPCAST_BF16: tl.constexpr,
                   PRECISION: tl.constexpr):
        t = tl.program_id(0)
        ob = tl.program_id(1)
        s = tl.load(slot_ids + t // tokens_per_slot)
        s = tl.where((s >= 0) & (s < num_slots), s, -1)
        # leader test: no earlier token has the same slot (first-occurrence; O(t) loads of 4-byte ids, from L1/L2)
        dup = 0
        for t0 in range(0, t, BLOCK_T):
            offs = t0 + tl.arange(0, BLOCK_T)
            ids = tl.load(slot_ids + offs // tokens_per_slot, mask=offs < t, other=-1)
            # -2 marks lanes past the range (never equal to s >= -1); any invalid id counts as -1 (no adapter)
            ids = tl.where(offs < t, tl.where((ids >= 0) & (ids < num_slots), ids, -1), -2)
            dup += tl.sum((ids == s).to(tl.int32), axis=0)
        if dup == 0:
            cols, rr, kk = ob * BLOCK_O + tl.arange(0, BLOCK_O), tl.arange(0, BLOCK_R), tl.arange(0, BLOCK_K)
            cmask, rmask = cols < out_features, rr < rank
            s64 = tl.maximum(s, 0).to(tl.int64)
            scale = tl.load(scales + s64)
            a_base = lora_a + s64 * in_features * rank
            for t0 in range((t // BLOCK_T) * BLOCK_T, num_tokens, BLOCK_T):
                toks = t0 + tl.arange(0, BLOCK_T)
                ids = tl.load(slot_ids + toks // tokens_per_slot, mask=toks < num_tokens, other=-1)
                ids = tl.where(toks < num_tokens, tl.where((ids >= 0) & (ids < num_slots), ids, -1), -2)
                mine = ids == s
                rows = toks.to(tl.int64)
                y_off, y_mask = rows[:, None] * out_features + cols[None, :], mine[:, None] & cmask[None, :]
                if s >= 0:
                    acc = tl.zeros((BLOCK_T, BLOCK_R), dtype=tl.float32)
                    for k0 in range(0, in_features, BLOCK_K):
                        kmask = (k0 + kk) < in_features
                        xt = tl.load(x + rows[:, None] * in_features + (k0 + kk)[None, :],
                                     mask=mine[:, None] & kmask[None, :], other=0.0)
                        at = tl.load(a_base + (k0 + kk)[:, None] * rank + rr[None, :],
                                     mask=kmask[:, None] & rmask[None, :], other=0.0)
                        if DOT_F32:
                            acc += tl.dot(xt, at, input_precision=PRECISION)
                        elif UPCAST_BF16:
                            # bf16 -> fp32 is exact in TF32 (8 <= 10 mantissa bits), so a TF32 dot is exact here;
                            # Triton's interpreter (3.9) computes bf16 x bf16 dots wrongly, this path it runs right
                            acc = tl.dot(xt.to(tl.float32), at.to(tl.float32), acc, input_precision="tf32")
                        else:
                            acc = tl.dot(xt, at, acc)
                    # B and y after the shrink: fewer live registers across the H loop (B[s] tile stays in L1/L2)
                    b_tile = tl.load(lora_b + s64 * rank * out_features + rr[:, None] * out_features + cols[None, :],
                                     mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
                    delta = tl.dot(acc * scale, b_tile, input_precision=PRECISION)
                    y_tile = tl.load(y + y_off, mask=y_mask, other=0.0)
                    res = (y_tile.to(tl.float32) + delta).to(out.dtype.element_ty)
                else:
                    res = tl.load(y + y_off, mask=y_mask, other=0.0)
                tl.store(out + y_off, res, mask=y_mask)

    return lora_small


def grid(num_tokens: int, out_features: int, rank: int, dtype: str, config: TritonConfig) -> tuple[int, int, int]:
    return (num_tokens, -(-out_features // config.effective(rank, dtype).block_o), 1)
