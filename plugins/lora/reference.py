"""NumPy semantics of ``LoRAOpPluginDynamic``: the ground truth every implementation is compared against.

Accumulates in float64 and rounds once to y's dtype at the end, which is the most accurate result a D-typed output
can hold; the CUDA kernel (fp32 accumulation) and the decomposed ONNX graph (D-typed MatMuls) are judged against it
with the dtype's tolerance.
"""

from __future__ import annotations

import numpy as np

from trtforge.build_engine.core.errors import InputError

from . import spec


def expand_slots(slot_ids: np.ndarray, x_shape: tuple[int, ...]) -> np.ndarray:
    """Per-token slot ids shaped ``x.shape[:-1]`` (per-sequence ids are repeated over the sequence)."""
    mode = spec.slot_mode(x_shape, slot_ids.shape)
    if mode == "token":
        return slot_ids.astype(np.int64)
    return np.repeat(slot_ids.astype(np.int64)[:, None], x_shape[1], axis=1)


def lora_update(x: np.ndarray, lora_a: np.ndarray, lora_b: np.ndarray, slot_ids: np.ndarray,
                scales: np.ndarray) -> np.ndarray:
    """The float64 update ``scales[s] * (x @ A[s]) @ B[s]`` per token (zero where s == -1), shape x.shape[:-1]+[O]."""
    n = lora_a.shape[0]
    slots = expand_slots(np.asarray(slot_ids), tuple(x.shape)).reshape(-1)
    if slots.size and (slots.min() < spec.NO_ADAPTER or slots.max() >= n):
        raise InputError(f"slot ids must be in [-1, {n}); got min {slots.min()} max {slots.max()}")
    xt = x.reshape(-1, x.shape[-1]).astype(np.float64)
    a = lora_a.astype(np.float64)
    b = lora_b.astype(np.float64)
    out = np.zeros((xt.shape[0], b.shape[-1]), np.float64)
    for s in np.unique(slots):
        if s < 0:
            continue
        rows = slots == s
        out[rows] = float(scales[s]) * ((xt[rows] @ a[s]) @ b[s])
    return out.reshape(*x.shape[:-1], b.shape[-1])


def lora_op(x: np.ndarray, y: np.ndarray, lora_a: np.ndarray, lora_b: np.ndarray, slot_ids: np.ndarray,
            scales: np.ndarray) -> np.ndarray:
    """The op's output in y's dtype: y + update, rounded once; exactly y where the slot is -1."""
    spec.output_shape(x.shape, lora_b.shape[-1])
    if y.shape != (*x.shape[:-1], lora_b.shape[-1]):
        raise InputError(f"y has shape {list(y.shape)}, expected {list((*x.shape[:-1], lora_b.shape[-1]))}")
    upd = lora_update(x, lora_a, lora_b, slot_ids, scales)
    out = (y.astype(np.float64) + upd).astype(y.dtype)
    mask = expand_slots(np.asarray(slot_ids), tuple(x.shape)) < 0
    out[mask] = y[mask]  # bit-exact passthrough (y + 0.0 could turn -0.0 into +0.0)
    return out
