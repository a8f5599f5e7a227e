"""compare_arrays on integer outputs: the distance is the exact integer difference (rounded to float64 only after),
for every pair of integer dtypes, checked against Python integers on fresh random values across each dtype's range."""

from __future__ import annotations

import numpy as np
import pytest

from trtforge.build_engine.verify.compare import compare_arrays
from trtforge_testing import seeded_rng

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def _draw(rng: np.random.Generator, dtype: str, n: int) -> np.ndarray:
    info = np.iinfo(dtype)
    vals = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
    vals[:2] = (info.min, info.max)  # the extremes, where a naive a - b overflows
    return vals


@pytest.mark.parametrize("da", INTS)
@pytest.mark.parametrize("db", INTS)
def test_distance_is_the_exact_integer_difference(da: str, db: str) -> None:
    rng = seeded_rng(f"compare-ints-{da}-{db}")
    a, b = _draw(rng, da, 64), _draw(rng, db, 64)
    b[5:9] = a[5:9].astype(object).clip(np.iinfo(db).min, np.iinfo(db).max).astype(db)  # some equal pairs
    exact = [abs(int(x) - int(y)) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    d = compare_arrays(a, b)
    assert d.max_abs == float(max(exact))
    assert d.mismatches == sum(1 for e in exact if e)
    if da == db:
        assert d.max_abs_unequal == float(max(exact))
        assert d.bitwise == (max(exact) == 0)


def test_int64_above_2_53_differs_by_one() -> None:
    """float64 rounds 2**60 + 3 and 2**60 + 4 alike; the table showed max |diff| 0 for outputs that differ."""
    base = np.int64(2**60) + seeded_rng("compare-2-53").integers(0, 1000, size=8)
    d = compare_arrays(base, base + 1)
    assert d.max_abs == 1.0 and d.max_abs_unequal == 1.0 and not d.bitwise
    assert d.mismatches == 8  # atol = rtol = 0: every element differs
