"""Cast a constant array exactly as ONNX Cast would, or refuse (``None``) when the answer is not unambiguous.

ONNX Cast rounds to nearest-even between float types and truncates toward zero from float to integer. Runtimes
agree on that only when the conversion is ONE rounding: numpy/ml_dtypes (hence onnx.reference) convert float64 and
int64 to bfloat16 through float32 (two roundings, which can differ from one correct rounding at ties:
1 + 2**-8 + 2**-40), and other runtimes differ again. So a cast to float16/bfloat16 is folded only when every
source value is exactly a float32 (then float32 -> target is the single rounding every runtime performs), and a
64-bit integer is converted to float32 only when it is exactly a float64 (|v| <= 2**53).

Refused (left to the runtime): the ambiguous float conversions above; float -> integer when any element is NaN,
infinite or out of the target's range (implementation-defined in practice); integer -> narrower integer when any
element is out of range (wrap-around is not specified); float -> bool when any element is NaN; any cast *to*
float8 (saturation modes); strings, complex, 4-bit and other types ``dtypes.KNOWN`` does not list.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from . import dtypes as dt


def _np_type(t: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(t))


def exact_cast(a: np.ndarray, src: int, dst: int, saturate: int | None = None) -> np.ndarray | None:
    """``Cast(a, to=dst)`` for an array of ONNX type ``src``; None when this must be left to the runtime."""
    if src not in dt.KNOWN or dst not in dt.KNOWN or dst in dt.FLOAT8:
        return None
    target = _np_type(dst)
    if src == dst:
        return a.astype(target, copy=True)
    with np.errstate(all="ignore"):
        if dst == dt.B:
            if src in dt.FLOATS:
                f = a.astype(np.float64)
                if np.isnan(f).any():
                    return None
                return f != 0
            return a != 0
        if src == dt.B:
            return a.astype(np.uint8).astype(target)
        if dst in dt.INTS:
            info = np.iinfo(target)
            if src in dt.FLOATS:
                f = a.astype(np.float64)
                if not np.isfinite(f).all():
                    return None
                f = np.trunc(f)
                if f.size and (f.min() < info.min or f.max() > info.max):
                    return None
                # |f| < 2**63 here except uint64 near the top; compare as Python ints there
                if dst in (dt.U64, dt.I64) and f.size and (abs(float(f.max())) >= 2.0**62 or
                                                           abs(float(f.min())) >= 2.0**62):
                    vals = [int(v) for v in f.reshape(-1)]
                    if min(vals) < info.min or max(vals) > info.max:
                        return None
                    return np.array(vals, dtype=target).reshape(a.shape)
                return f.astype(target)
            if a.size:
                lo, hi = int(a.min()), int(a.max())
                if lo < info.min or hi > info.max:
                    return None
            return a.astype(target)
        # float target (float16, bfloat16, float32, float64)
        if src in (dt.I64, dt.U64) and a.size and max(abs(int(a.min())), abs(int(a.max()))) > 2**53:
            return None  # int64 -> float64 would already round: no single-rounding path
        wide = a.astype(np.float64)  # exact now
        if dst == dt.F64:
            return wide
        if dst == dt.F32:
            return wide.astype(np.float32)  # one correct rounding
        narrow = wide.astype(np.float32)
        if src in (dt.F64, dt.I32, dt.U32, dt.I64, dt.U64):
            same = (narrow.astype(np.float64) == wide) | (np.isnan(wide) & np.isnan(narrow))
            if not bool(np.all(same)):
                return None  # not exactly a float32: runtimes round twice differently
        return narrow.astype(target)
