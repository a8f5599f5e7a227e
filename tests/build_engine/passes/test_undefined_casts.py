"""Casts whose result is undefined on some input are never removed or merged (``dtypes.cast_defined``).

Proof over every ordered pair of supported types, on every input value class (NaN, +-inf, -0.0, subnormals, the
extremes, out-of-range values; exhaustive for 8/16-bit types, boundary plus random for wider ones):
- each pair declared defined gives, under ``onnx.reference``, the mathematically exact result (the value itself,
  truncation of an in-range integer, one correct rounding);
- each pair declared undefined has a witness: an input whose result the spec leaves open (NaN/inf/out-of-range to
  an integer, NaN to bool), or a value where rounding through float32 first differs from one rounding;
- every chain ``T -> U -> V`` that ``cast_chain`` would collapse gives the bits of ``T -> V`` under onnx.reference;
and regressions from the issue: ``uint32 -> double -> int{32,16,8}``/``uint{16,8}``, ``fp16 -> fp32 -> uint32``.
"""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference.ops.op_cast import cast_to

from trtforge.build_engine.passes import dtypes as dt

ALL = sorted(dt.KNOWN)
SMALL = {T.BOOL, T.INT8, T.UINT8, T.INT16, T.UINT16, T.FLOAT16, T.BFLOAT16} | set(dt.FLOAT8)


def _np(t: int) -> np.dtype:
    return np.dtype(h.tensor_dtype_to_np_dtype(t))


def values(t: int) -> np.ndarray:
    """Every value (8/16-bit types) or the value classes plus random bit patterns (wider types)."""
    d = _np(t)
    if t == T.BOOL:
        return np.array([False, True])
    if t in SMALL:
        return np.arange(2 ** (8 * d.itemsize), dtype=np.uint64).astype(f"u{d.itemsize}").view(d)
    rng = np.random.default_rng(t)
    rand = rng.integers(0, 2 ** (8 * d.itemsize), size=4000, dtype=np.uint64).astype(f"u{d.itemsize}").view(d)
    if d.kind in "iu":
        info = np.iinfo(d)
        edges = [0, 1, -1, 127, 128, 255, 256, 32767, 32768, 65535, 65536, 65519, 65520, 2**24 + 1, 2**31 - 1, 2**31,
                 2**32 - 1, 2**30 + 2**22 + 1, 2**53 + 1, 2**60 + 2**36 + 1, int(info.min), int(info.max)]
        return np.concatenate([np.array([e for e in edges if info.min <= e <= info.max], dtype=d), rand])
    f = np.finfo(d)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, 2.5, -2.5, 65504.0, 65520.0, 2.0**31, -2.0**31 - 1, 2.0**32,
               2.0**63, 2.0**64, 3.4e38, float(f.max), float(f.min), float(f.tiny), float(f.smallest_subnormal),
               -float(f.smallest_subnormal), 1 + 2.0**-8 + 2.0**-30, 1 + 2.0**-11 + 2.0**-40]
    with np.errstate(all="ignore"):
        return np.concatenate([np.array(special, np.float64).astype(d), rand])


def cast(x: np.ndarray, to: int) -> np.ndarray:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(cast_to(x, to, saturate=True))


def exact_value(x: np.ndarray, s: int, v: int) -> np.ndarray:
    """The mathematically exact result of a defined cast (independent of onnx.reference's Cast)."""
    d = _np(v)
    if v == T.BOOL:
        return x.astype(np.float64) != 0 if s in dt.FLOATS else x != 0
    if s == T.BOOL or v in dt.INTS:
        return np.array([int(e) for e in x.reshape(-1)], dtype=object).astype(d)
    if s in (T.INT64, T.UINT64):  # to float64 (float32 from these is not defined): Python's correct rounding
        return np.array([float(int(e)) for e in x.reshape(-1)], np.float64).astype(d)
    with np.errstate(all="ignore"):
        return x.astype(np.float64).astype(d)  # exact widening, then ONE correct rounding (value exactly f32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype:
        return False
    if a.dtype == np.bool_:
        return bool(np.array_equal(a, b))
    bits = (a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}"))
    if a.dtype.kind != "iu":
        with np.errstate(invalid="ignore"):
            bits |= np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
    return bool(bits.all())


@pytest.mark.parametrize("s", ALL, ids=dt.name)
def test_defined_pairs_give_the_exact_value_on_every_value_class(s: int) -> None:
    x = values(s)
    for v in ALL:
        if dt.cast_defined(s, v) and s != v:
            assert same_bits(cast(x, v), exact_value(x, s, v)), (dt.name(s), dt.name(v))


def _rne(q: Fraction, bits: int) -> Fraction:
    """``q`` (> 0, normal range) rounded to ``bits`` significant bits, ties to even."""
    e = q.numerator.bit_length() - q.denominator.bit_length()
    scale = Fraction(2) ** (bits - 1 - e)
    while q * scale >= 2**bits:
        scale /= 2
    while q * scale < 2 ** (bits - 1):
        scale *= 2
    m = q * scale
    r = m.numerator // m.denominator
    rem = m - r
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and r % 2):
        r += 1
    return r / scale


_PRECISION = {T.FLOAT16: 11, T.BFLOAT16: 8, T.FLOAT: 24}
#: (target) -> a value of a wide source type where one rounding differs from rounding through float32 (to float16 /
#: bfloat16) or through float64 (64-bit integers to float32)
_ROUNDING_WITNESS = {T.BFLOAT16: Fraction(2**30 + 2**22 + 1), T.FLOAT: Fraction(2**60 + 2**36 + 1)}


def witness(s: int, v: int) -> str | None:
    """Why ``s -> v`` is undefined, shown on a concrete input; None when no witness is found."""
    x = values(s)
    if v in dt.FLOAT8:
        return "float8 target: saturate/round_mode attributes decide" if s != T.BOOL else None
    with np.errstate(invalid="ignore"):
        f = x.astype(np.float64)
    if v == T.BOOL:
        return "NaN -> bool" if s in dt.FLOATS and np.isnan(f).any() else None
    if v in dt.INTS:
        info = np.iinfo(_np(v))
        if s in dt.FLOATS:
            return "NaN/inf/out-of-range float -> int" if (~np.isfinite(f)).any() or (f > info.max).any() else None
        ints = [int(e) for e in x]
        return "out-of-range narrowing" if min(ints) < info.min or max(ints) > info.max else None
    if s == T.DOUBLE:  # a double just above a float16/bfloat16 tie, not a float32
        q = 1 + Fraction(1, 2 ** (_PRECISION.get(v, 53))) + Fraction(1, 2**40)
    elif s in dt.INTS and v in _ROUNDING_WITNESS:
        q = _ROUNDING_WITNESS[v]
        if not np.iinfo(_np(s)).min <= q <= np.iinfo(_np(s)).max:
            return None
    else:
        return None
    once = _rne(q, _PRECISION[v])
    via = _rne(_rne(q, 24 if s == T.DOUBLE or v != T.FLOAT else 53), _PRECISION[v])
    return f"double rounding of {q}" if once != via else None


@pytest.mark.parametrize("s", ALL, ids=dt.name)
def test_every_undefined_pair_has_a_witness(s: int) -> None:
    for v in ALL:
        if not dt.cast_defined(s, v):
            assert witness(s, v), (dt.name(s), dt.name(v))


@pytest.mark.parametrize("t", ALL, ids=dt.name)
def test_every_collapsible_chain_keeps_every_bit(t: int) -> None:
    x = values(t)
    for u in ALL:
        if u == t or not dt.embeds(u, t):
            continue
        mid = cast(x, u)
        for v in ALL:
            if v != t and dt.cast_defined(t, v):
                assert same_bits(cast(mid, v), cast(x, v)), (dt.name(t), dt.name(u), dt.name(v))


def _chain(src: int, mid: int, dst: int) -> onnx.ModelProto:
    nodes = [h.make_node("Cast", ["x"], ["a"], to=mid), h.make_node("Cast", ["a"], ["y"], to=dst)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", src, [8])], [h.make_tensor_value_info("y", dst, [8])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize(("src", "mid", "dst"), [
    (T.UINT32, T.DOUBLE, T.INT32), (T.UINT32, T.DOUBLE, T.INT16), (T.UINT32, T.DOUBLE, T.INT8),
    (T.UINT32, T.DOUBLE, T.UINT16), (T.UINT32, T.DOUBLE, T.UINT8), (T.FLOAT16, T.FLOAT, T.UINT32),
    (T.FLOAT16, T.FLOAT, T.INT8), (T.INT32, T.DOUBLE, T.BFLOAT16), (T.INT16, T.INT32, T.INT8),
], ids=lambda t: dt.name(t))
def test_issue_regressions_are_not_collapsed(kit, src: int, mid: int, dst: int) -> None:
    from onnx.reference import ReferenceEvaluator

    from trtforge.build_engine.passes import fold

    m = _chain(src, mid, dst)
    res = fold(m)
    assert [n.op_type for n in res.model.graph.node] == ["Cast", "Cast"], res.report
    x = values(src)[:8].copy()
    if src == T.UINT32:
        x = np.array([1, 2**31, 2**32 - 1, 2**31 + 7, 40000, 300, 65535, 2**30 + 2**22 + 1], np.uint32)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = ReferenceEvaluator(m).run(None, {"x": x})[0]
        b = ReferenceEvaluator(res.model).run(None, {"x": x})[0]
    assert same_bits(np.asarray(a), np.asarray(b))
