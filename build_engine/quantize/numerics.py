"""Weight quantization arithmetic (NumPy): the stored integer/fp8 values and their scales, and the fake-quantized
(quantize then dequantize) weights the searches measure with. Symmetric everywhere, zero points 0, as TensorRT's
explicit quantization requires.

- int8: per output channel (axis 1 of ``[in, out]``), scale = max|W[:, n]| / 127, values in [-127, 127];
- fp8: per output channel, scale = max|W[:, n]| / 448 (E4M3's largest finite), round-to-nearest-even via ml_dtypes;
- int4: per block of ``block`` input rows and output channel (DequantizeLinear ``axis=0, block_size=block``),
  scale = max|block| / 7, values in [-8, 7] (the last block may be short: ONNX scales have ceil(in / block) rows).

Every range (weight channel, block, activation) below 1e-12 counts as 1e-12 (scale ``max(amax, 1e-12) / qmax``): an
all-zero channel gets a positive scale (QuantizeLinear divides by it; TensorRT refuses scales <= 0). The floor is
on the range, not on the scale: a channel of max |W| = 1e-11 still gets its 127 int8 steps (a floor of 1e-12 on the
scale stored it as codes 0..11, and a smaller one as all zeros).
"""

from __future__ import annotations

import numpy as np

INT8_MAX = 127.0
FP8_MAX = 448.0
INT4_MAX = 7.0
_TINY = np.float32(1e-12)
ACT_QMAX = {"int8": INT8_MAX, "fp8": FP8_MAX}


def act_scale(amax: float, mode: str) -> np.float32:
    """The per-tensor activation scale ``max(amax, 1e-12) / qmax``: always positive (an activation that is all zeros
    on the calibration set would otherwise get scale 0, which QuantizeLinear divides by: 0 / 0 = NaN in fp8, and
    TensorRT refuses non-positive scales)."""
    return np.float32(max(amax, float(_TINY)) / ACT_QMAX[mode])


def _fp8(x: np.ndarray) -> np.ndarray:
    import ml_dtypes

    return np.clip(x, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)


def _block_amax(w: np.ndarray, block: int) -> np.ndarray:
    k, n = w.shape
    nb = -(-k // block)
    a = np.abs(w)
    if k == nb * block:
        return a.reshape(nb, block, n).max(1)
    padded = np.zeros((nb * block, n), np.float32)
    padded[:k] = a
    return padded.reshape(nb, block, n).max(1)


#: Elements of one weight converted at a time: the temporaries of ``quantize_weight`` (w / scale, its rounding) are
#: those of a slice of columns, not of the whole weight (three float copies of a 1 GiB LM head otherwise).
_CHUNK = 1 << 22


def _column_slices(w: np.ndarray) -> list[slice]:
    cols = max(1, _CHUNK // max(1, w.shape[0]))
    return [slice(j, j + cols) for j in range(0, w.shape[1], cols)]


def quantize_weight(w: np.ndarray, mode: str, block: int = 128,
                    clip: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(stored values, float32 scales) for an ``[in, out]`` float32 weight. ``clip`` (int4, ``[blocks, out]``,
    in (0, 1]) shrinks each block's range (AWQ's clipping: outliers saturate, the rest get finer steps). Computed a
    slice of output channels at a time (every step is per channel or elementwise: the same values)."""
    if mode not in ("int4-wo", "int8", "fp8"):
        raise ValueError(f"unknown mode {mode!r}")
    w = w.astype(np.float32, copy=False)
    parts = _column_slices(w)
    if mode == "int4-wo":
        import ml_dtypes

        amax = np.concatenate([_block_amax(w[:, c], block) for c in parts], axis=1) * (1.0 if clip is None else clip)
        scale = (np.maximum(amax, _TINY) / INT4_MAX).astype(np.float32)
        q = np.empty(w.shape, ml_dtypes.int4)
        for c in parts:
            full = np.repeat(scale[:, c], block, axis=0)[: w.shape[0]]
            q[:, c] = np.clip(np.rint(w[:, c] / full), -8, 7).astype(ml_dtypes.int4)
        return q, scale
    amax = np.concatenate([np.abs(w[:, c]).max(0) for c in parts])
    if mode == "int8":
        scale = (np.maximum(amax, _TINY) / INT8_MAX).astype(np.float32)
        q = np.empty(w.shape, np.int8)
        for c in parts:
            q[:, c] = np.clip(np.rint(w[:, c] / scale[c]), -INT8_MAX, INT8_MAX).astype(np.int8)
        return q, scale
    import ml_dtypes

    scale = (np.maximum(amax, _TINY) / FP8_MAX).astype(np.float32)
    q = np.empty(w.shape, ml_dtypes.float8_e4m3fn)
    for c in parts:
        q[:, c] = _fp8(w[:, c] / scale[c])
    return q, scale


def dequantize_weight(q: np.ndarray, scale: np.ndarray, mode: str, block: int = 128) -> np.ndarray:
    if mode == "int4-wo":
        return q.astype(np.float32) * np.repeat(scale, block, axis=0)[: q.shape[0]]
    return q.astype(np.float32) * scale


def fake_quant_weight(w: np.ndarray, mode: str, block: int = 128,
                      clip: np.ndarray | np.floating | float = 1.0) -> np.ndarray:
    if mode == "int4-wo":  # the same arithmetic as quantize_weight, kept in float32 (AWQ's search calls it often)
        w = w.astype(np.float32)
        amax = _block_amax(w, block) * clip
        full = np.repeat(np.maximum(amax, _TINY) / INT4_MAX, block, axis=0)[: w.shape[0]]
        return np.clip(np.rint(w / full), -8, 7) * full
    q, s = quantize_weight(w, mode, block)
    return dequantize_weight(q, s, mode, block)


def fake_quant_act(x: np.ndarray, amax: float, mode: str) -> np.ndarray:
    """Per-tensor symmetric activation quantization, as the inserted QuantizeLinear/DequantizeLinear compute it
    (onnxruntime bit for bit): int8 QuantizeLinear saturates to [-128, 127], so an input below the calibrated range
    reaches -128 (weights are stored in [-127, 127])."""
    scale = act_scale(amax, mode)
    if mode == "int8":
        return np.clip(np.rint(x / scale), -INT8_MAX - 1, INT8_MAX).astype(np.float32) * scale
    return _fp8(x / scale).astype(np.float32) * scale
