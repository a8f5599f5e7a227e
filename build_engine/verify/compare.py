"""The one array comparison of trtforge's checks: ``compare_arrays(a, b, atol, rtol)`` computes, in one pass over
the elements, everything ``fold --check`` (bit equality) and ``diff`` (tolerances) report.

- ``bitwise``: same dtype and shape, and every element has the same bits, except that NaN equals NaN of the same
  sign whatever its payload and quiet bit (not part of ONNX semantics; runtimes differ there); -0.0 and +0.0
  differ. ``max_abs_unequal`` is the largest ``|a - b|`` over the elements that are not equal in that sense (a NaN
  against a number counts as inf; inf when dtypes or shapes differ): what ``fold --check`` prints.
- ``identical``: same dtype and shape and byte-identical arrays (NaN payloads count too): ``diff`` with
  ``atol = rtol = 0``.
- Polygraphy's element-wise rule, as ``diff`` reports it: an element mismatches when ``|a-b| > atol`` AND
  ``|a-b|/|b| > rtol`` (NaN always mismatches; equal infinities are a difference of 0, as with Polygraphy's
  ``infinities_compare_equal``, so a model with inf outputs matches itself); ``max_abs`` and ``max_rel`` ignore
  NaN, and an infinite difference (a finite value against an infinite reference, or opposite infinities) is an
  infinite relative error; ``rel_to_scale`` is ``max_abs / max|b|`` (the largest finite ``|b|``: a -inf mask is no
  scale), the error relative to the output's scale (element-wise ``max_rel`` explodes near zero).
  Arrays of different dtypes (an fp16 model against its fp32 original) are compared as float64 values; integer
  arrays' differences are computed exactly first (two int64 values above 2**53 that float64 rounds alike differ).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

_INF = float("inf")


@dataclass(frozen=True)
class ArrayDiff:
    same_type: bool
    bitwise: bool
    identical: bool
    max_abs_unequal: float
    max_abs: float
    max_rel: float
    mismatches: int
    total: int
    rel_to_scale: float


def _as_bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind in "fV" or "float" in a.dtype.name  # ml_dtypes' bfloat16 / float8 are kind "V"


def compare_arrays(a: np.ndarray, b: np.ndarray, atol: float = 0.0, rtol: float = 0.0) -> ArrayDiff:
    """Compare ``a`` (the candidate) against ``b`` (the reference); see the module docstring for each number."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        n = max(a.size, b.size)
        return ArrayDiff(False, False, False, _INF, _INF, _INF, n, n, _INF)
    same_type = a.dtype == b.dtype
    identical = same_type and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    if a.dtype.kind in "OUS" or b.dtype.kind in "OUS":  # strings: equal or not, no distance
        n = int(np.count_nonzero(a != b))
        return ArrayDiff(same_type, same_type and n == 0, identical, 0.0 if same_type else _INF, 0.0, 0.0, n,
                         int(a.size), 0.0)
    if a.dtype == np.bool_ or b.dtype == np.bool_:
        fa = fb = None
        absd = (a != b).astype(np.float64)
        denom = np.ones_like(absd)
    else:
        wide = np.complex128 if "c" in (a.dtype.kind, b.dtype.kind) else np.float64  # complex: |a - b| is a modulus
        with np.errstate(invalid="ignore", over="ignore"):  # a NaN of float8 / bfloat16 cast to float64 warned
            fa, fb = a.astype(wide), b.astype(wide)
        if a.dtype.kind in "iu" and b.dtype.kind in "iu":
            absd = _int_distance(a, b)  # float64 would make 2**60 + 3 and 2**60 + 4 equal
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                absd = np.where(fa == fb, 0.0, np.abs(fa - fb))  # inf - inf is NaN: equal infinities differ by 0
        denom = np.abs(fb)
    bitwise, unequal = _bitwise(a, b, fa, fb, absd) if same_type else (False, _INF)
    with np.errstate(invalid="ignore", divide="ignore"):
        reld = absd / np.where(denom == 0, np.finfo(np.float64).eps, denom)
    # a finite value against an infinite reference: inf / inf is NaN, which max_rel skips (it read 0); unbounded
    reld = np.where(np.isinf(absd), _INF, reld)
    mism = ((absd > atol) | np.isnan(absd)) & ((reld > rtol) | np.isnan(reld))
    max_abs, max_rel = _nanmax(absd), _nanmax(reld)
    scale = _nanmax(np.where(np.isinf(denom), np.nan, denom))  # an inf in b (a -inf mask) is no scale: max|b| finite
    rel_to_scale = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else _INF)
    return ArrayDiff(same_type, bitwise, identical, unequal, max_abs, max_rel, int(mism.sum()), int(a.size),
                     rel_to_scale)


def _int_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``|a - b|`` of two integer arrays, computed exactly and then rounded to float64, so it is 0 exactly where the
    integers are equal (int64 values above 2**53 that float64 rounds alike still differ by at least 1)."""
    if a.dtype.kind != b.dtype.kind:  # int64 against uint64 has no common fixed-width type: Python integers
        return np.abs(a.astype(object) - b.astype(object)).astype(np.float64)
    if a.dtype.kind == "i":  # int64 -> uint64 keeping order (v + 2**63), so the difference below cannot overflow
        sign = np.uint64(1 << 63)
        ka, kb = a.astype(np.int64).view(np.uint64) ^ sign, b.astype(np.int64).view(np.uint64) ^ sign
    else:
        ka, kb = a.astype(np.uint64), b.astype(np.uint64)
    return np.where(ka >= kb, ka - kb, kb - ka).astype(np.float64)


def _nanmax(x: np.ndarray) -> float:
    """max ignoring NaN; 0.0 for an empty array, NaN when every element is NaN."""
    if not x.size:
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slice: the NaN result says it
        return float(np.nanmax(x))


def _bitwise(a: np.ndarray, b: np.ndarray, fa: np.ndarray | None, fb: np.ndarray | None,
             absd: np.ndarray) -> tuple[bool, float]:
    """(bit-equal with NaN == NaN of the same sign, max |a-b| over the unequal elements with NaN-vs-number as inf)
    for one dtype. A NaN's payload and quiet bit are not compared: runtimes differ there themselves (onnx.reference
    quiets a signalling NaN in a float32 -> float64 Cast; ml_dtypes keeps a bfloat16 payload that a float16 has no
    room for)."""
    same = _as_bits(a) == _as_bits(b)
    if fa is not None and fb is not None and _is_float(a):
        same |= np.isnan(fa) & np.isnan(fb) & (np.signbit(fa) == np.signbit(fb))
        diff = np.nan_to_num(np.where(same, 0.0, absd), nan=np.inf)
    else:
        diff = np.where(same, 0.0, absd)
    return bool(np.all(same)), float(diff.max()) if diff.size else 0.0


def byte_mismatches(a: np.ndarray, b: np.ndarray) -> int:
    """Elements of ``a`` whose bytes differ from ``b``'s at the same index (every element when dtypes or shapes
    differ): the mismatch count of a bitwise comparison, where identical NaNs match."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.size, b.size)
    if a.dtype.kind in "OUS":
        return int(np.count_nonzero(a != b))
    ra = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, a.dtype.itemsize)
    rb = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, b.dtype.itemsize)
    return int(np.count_nonzero(np.any(ra != rb, axis=1)))


def nan_count(a: np.ndarray, b: np.ndarray) -> int:
    """Elements that are NaN in ``a`` or in ``b`` (same shape; 0 for non-float arrays): each is a mismatch under
    Polygraphy's element-wise rule, even where both are NaN."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or not (_is_float(a) or _is_float(b)):
        return 0
    with np.errstate(invalid="ignore"):
        return int(np.count_nonzero(np.isnan(a.astype(np.float64)) | np.isnan(b.astype(np.float64))))
