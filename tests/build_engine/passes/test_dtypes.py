"""Proof of the embedding table (``dtypes.EMBEDDED_IN``) against onnx.reference's Cast, in both directions.

For every ordered pair (T, U) of supported types: U embeds T exactly when every value of T survives T -> U with its
value (sign of zero included, NaN stays NaN) and U -> T gives back the same bits. Exhaustive for every 8- and 16-bit
type; boundary plus random values for 32- and 64-bit types (enough to find a counterexample for every pair the
table leaves out, and to exercise every pair it lists).
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference.ops.op_cast import cast_to

from trtforge.build_engine.passes import dtypes as dt

SMALL = [T.BOOL, T.INT8, T.UINT8, T.INT16, T.UINT16, T.FLOAT16, T.BFLOAT16, T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ,
         T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ]
WIDE = [T.INT32, T.UINT32, T.INT64, T.UINT64, T.FLOAT, T.DOUBLE]
ALL = sorted(dt.KNOWN)


def _np(t: int) -> np.dtype:
    return np.dtype(h.tensor_dtype_to_np_dtype(t))


def _every_value(t: int) -> np.ndarray:
    d = _np(t)
    if t == T.BOOL:
        return np.array([False, True])
    bits = np.arange(2 ** (8 * d.itemsize), dtype=np.uint64).astype(np.dtype(f"u{d.itemsize}"))
    return bits.view(d)


def _sample_values(t: int, rng: np.random.Generator) -> np.ndarray:
    d = _np(t)
    if d.kind in "iu":
        info = np.iinfo(d)
        edges = {0, 1, 2, 3, 127, 128, 255, 256, 257, 2047, 2049, 32767, 32768, 65535, 65536, 65537, 2**24 - 1,
                 2**24 + 1, 2**31 - 1, 2**31, 2**32 - 1, 2**53 + 1, 2**63 - 1, int(info.min), int(info.max)}
        edges |= {-e for e in list(edges)}
        vals = [v for v in edges if info.min <= v <= info.max]
        rand = rng.integers(int(info.min), int(info.max), size=20000, dtype=d, endpoint=True)
        return np.concatenate([np.array(vals, dtype=d), rand])
    finfo = np.finfo(d)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 1 + 2.0**-11, 1 + 2.0**-24, 1 + 2.0**-30,
               65504.0, 65520.0, 448.0, 464.0, 57344.0, 3.4e38, float(finfo.max), float(finfo.tiny),
               float(finfo.smallest_subnormal), 2.0**-24, 2.0**-25, 2.0**-133, 2.0**-149, 2.0**24 + 2, 1.5, 2.5]
    with np.errstate(over="ignore", invalid="ignore"):
        spec = np.array(special, dtype=np.float64).astype(d)
    rand = rng.integers(0, 2 ** (8 * d.itemsize), size=20000, dtype=np.uint64).astype(f"u{d.itemsize}").view(d)
    return np.concatenate([spec, rand])


def _as_f64(a: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return a.astype(np.float64)


def _survives(x: np.ndarray, t: int, u: int) -> bool:
    """x (type t) -> u keeps every value exactly, and u -> t returns the same bits (NaN stays NaN)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = cast_to(x, u, saturate=True)
        back = cast_to(y, t, saturate=True)
        fx, fy = _as_f64(x), _as_f64(y)
    nan_x, nan_y = np.isnan(fx), np.isnan(fy)
    value_ok = np.where(nan_x, nan_y, (fx == fy) & (np.signbit(fx) == np.signbit(fy)) & ~nan_y)
    if x.dtype == np.bool_:
        bits_ok = back == x
    else:
        bits_x = x.view(f"u{x.dtype.itemsize}")
        bits_b = np.asarray(back).view(f"u{x.dtype.itemsize}")
        bits_ok = (bits_x == bits_b) | (nan_x & np.isnan(_as_f64(np.asarray(back))))
    return bool(np.all(value_ok) and np.all(bits_ok))


@pytest.mark.parametrize("t", SMALL, ids=dt.name)
def test_embedding_table_exhaustive_for_small_types(t: int) -> None:
    x = _every_value(t)
    assert len(np.unique(x.view(f"u{x.dtype.itemsize}") if t != T.BOOL else x)) == len(x)
    for u in ALL:
        assert dt.embeds(u, t) == _survives(x, t, u), (dt.name(t), dt.name(u))


@pytest.mark.parametrize("t", WIDE, ids=dt.name)
def test_embedding_table_on_boundary_and_random_values_for_wide_types(t: int) -> None:
    x = _sample_values(t, np.random.default_rng(t))
    for u in ALL:
        assert dt.embeds(u, t) == _survives(x, t, u), (dt.name(t), dt.name(u))


def test_table_is_the_single_source_and_has_expected_landmarks() -> None:
    assert dt.embeds(T.FLOAT, T.FLOAT16) and dt.embeds(T.FLOAT, T.BFLOAT16) and not dt.embeds(T.FLOAT16, T.BFLOAT16)
    assert dt.embeds(T.DOUBLE, T.INT32) and not dt.embeds(T.FLOAT, T.INT32)
    assert all(dt.embeds(u, T.BOOL) for u in dt.KNOWN) and not any(dt.embeds(T.BOOL, u) for u in dt.KNOWN - {T.BOOL})
    assert not dt.embeds(T.STRING, T.STRING) or T.STRING not in dt.KNOWN
    assert ml_dtypes.bfloat16 == _np(T.BFLOAT16)
