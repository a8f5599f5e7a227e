"""``compare_arrays``: an infinite difference is an infinite relative error, also against an infinite reference
(``inf / inf`` was NaN, which ``max_rel`` skips, so diff showed max rel 0 beside a failed verdict)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtforge.build_engine.verify.compare import compare_arrays
from trtforge_testing import seeded_rng


@pytest.mark.parametrize("ref, got", [(np.inf, 1.5), (-np.inf, -3.0), (np.inf, -np.inf), (2.0, np.inf)])
def test_an_infinite_difference_is_an_infinite_relative_error(ref: float, got: float) -> None:
    rng = seeded_rng(f"compare-inf-{ref}-{got}")
    b = rng.standard_normal(16).astype(np.float32)
    a = b.copy()
    b[5], a[5] = ref, got
    d = compare_arrays(a, b, atol=1e-3, rtol=1e-3)
    assert math.isinf(d.max_rel) and math.isinf(d.max_abs)
    assert d.mismatches == 1 and not d.bitwise


def test_equal_infinities_stay_a_zero_difference() -> None:
    rng = seeded_rng("compare-equal-inf")
    b = rng.standard_normal(8)
    b[[1, 3]] = [np.inf, -np.inf]
    d = compare_arrays(b.copy(), b)
    assert d.max_rel == 0.0 and d.max_abs == 0.0 and d.mismatches == 0 and d.bitwise
