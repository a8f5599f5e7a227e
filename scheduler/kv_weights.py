"""Weight memory of a decoder for ``kv-plan``, with its HF ``quantization_config`` modelled where it is known.

Modelled (``WeightQuant.from_config``): ``awq``, ``gptq`` (and ``gptq_marlin``/``awq_marlin``) with ``bits`` (or
AWQ's ``w_bit``) and ``group_size`` (or ``q_group_size``; -1 or absent: one group per output column), ``fp8``
(``quant_method: fp8``, one byte per weight and a per-tensor or per-block scale), and ``bitsandbytes`` 8-bit
(``load_in_8bit``: one byte and a float32 scale per output row) and 4-bit (``load_in_4bit``: half a byte and, with
``bnb_4bit_use_double_quant``, one 8-bit absmax per 64 weights, else a float32 one). Only the attention and MLP
projections are quantized (every expert's MLP too); embeddings, the LM head, norms and the MoE router stay in the
plan's weights dtype, as those methods leave them. Any other method (compressed-tensors, hqq, ...) or a config
without its bit width is not modelled: the weights are sized in the plan's dtype (a lower bound on the KV
capacity) and ``kv-plan`` says so.

Group overhead per quantized weight (AWQ/GPTQ): a 16-bit scale and a ``bits``-wide zero point per group, so
``bits / 8 + (2 + bits / 8) / group_size`` bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2,
                                 "fp8": 1, "float8": 1, "int8": 1}
#: What ``--kv-dtype`` accepts: fp8 and int8 KV caches hold one byte per element (half of fp16/bf16).
KV_DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp8", "int8")
#: CUDA context, cuBLAS/attention workspaces and the runtime's own buffers (TensorRT-LLM leaves about this much).
RUNTIME_RESERVE_BYTES = 1 * GIB


@dataclass(frozen=True)
class WeightQuant:
    """``bytes_per_weight`` of the quantized projections; ``label`` names it ("awq 4-bit, group 128")."""

    label: str
    bytes_per_weight: float

    @staticmethod
    def from_config(q: Any) -> tuple[str, WeightQuant | None]:
        """The config's quantization in words (empty when none) and its model (None: not modelled)."""
        if not q:
            return "", None
        if not isinstance(q, dict):
            return "quantized", None
        method = str(q.get("quant_method") or "quantized").lower()
        bits = q.get("bits") or q.get("w_bit") or (4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None)
        label = f"{method} {bits}-bit" if bits else method
        if method == "fp8":
            return label, WeightQuant("fp8", 1.0)
        if not isinstance(bits, int) or isinstance(bits, bool) or not 2 <= bits <= 8:
            return label, None
        if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
            group = q.get("group_size", q.get("q_group_size", -1))
            # a group above int32 (10**400) overflowed the overhead's float division (exit 3): not modelled then
            if not isinstance(group, int) or isinstance(group, bool) or group == 0 or not -1 <= group < 2**31:
                return label, None
            overhead = 0.0 if group == -1 else (2 + bits / 8) / group
            return label, WeightQuant(f"{label}, group {group}", bits / 8 + overhead)
        if method == "bitsandbytes" and bits == 8:
            return label, WeightQuant(label, 1.0)  # + a float32 scale per row: negligible per weight
        if method == "bitsandbytes" and bits == 4:
            absmax = 1 / 64 if q.get("bnb_4bit_use_double_quant") else 4 / 64
            return label, WeightQuant(label, 0.5 + absmax)
        return label, None


def projection_params(num_layers: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                      intermediate: int, num_experts: int) -> int:
    """Parameters of the attention (q, k, v, o) and MLP (gate, up, down of every expert) projections."""
    attn = hidden * num_heads * head_dim * 2 + hidden * num_kv_heads * head_dim * 2
    return num_layers * (attn + 3 * hidden * intermediate * num_experts)


def weights_bytes(total_params: int, projections: int, dtype_bytes: float, quant: WeightQuant | None,
                  tp: int) -> float:
    """Bytes of weights per GPU of a ``tp``-way group: the projections at the quantized size, the rest (embeddings,
    LM head, norms, router) at ``dtype_bytes``; without ``quant`` every parameter at ``dtype_bytes``."""
    if quant is None:
        return total_params * dtype_bytes / tp
    return (projections * quant.bytes_per_weight + (total_params - projections) * dtype_bytes) / tp


def activation_bytes(spec: Any, dtype_bytes: float, max_num_tokens: int, max_batch: int, tp: int) -> int:
    """Estimated activation peak of one forward over ``max_num_tokens`` tokens.

    Live at the MLP: the residual stream and normed input (2 x hidden), q/k/v/attention output
    ((heads + 2 kv_heads) x head_dim / tp + hidden), gate/up/act (3 x intermediate / tp); plus fp32 logits for
    ``max_batch`` last tokens (the LM head runs on the last token of each sequence only).
    """
    attn = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim / tp + spec.hidden_size
    per_token = 2 * spec.hidden_size + attn + 3 * spec.intermediate_size / tp
    return int(max_num_tokens * per_token * dtype_bytes + max_batch * spec.vocab_size * 4 / tp)


def valid_tps(spec: Any) -> list[int]:
    """The tensor-parallel sizes that split ``spec``'s heads evenly (``_check_tp``), ascending."""
    q, kv = spec.num_heads, spec.num_kv_heads
    small = [t for t in range(1, math.isqrt(q) + 1) if not q % t]  # the divisors of q, in O(sqrt(q)) steps
    divisors = sorted({*small, *(q // t for t in small)})
    return [t for t in divisors if not (kv % t if t <= kv else t % kv)]
