"""AWQ-style activation-aware scale search for INT4 weight-only quantization (Lin et al., 2024).

Per group of projections sharing an activation ``x``: salient input channels (large mean |x_j|) are protected by
scaling their weight rows up before round-to-nearest block quantization and dividing ``x`` by the same factor:
``s = mean|x| ** a`` (normalised so sqrt(max * min) = 1), with ``a`` searched on a grid of ``GRID`` points in [0, 1)
for the smallest output error ``sum_w ||X W - (X / s) Q(s * W)||^2`` on calibration rows. ``a = 0`` is plain
round-to-nearest, so the search never does worse than RTN on the calibration rows. Then AWQ's clipping search
(``clip_search``): per block and output channel, the range shrink ratio in ``CLIP_GRID`` (1.0 included, so never
worse than no clipping) with the smallest output error ``dW^T (X_b^T X_b) dW`` on the migrated calibration rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .calibrators import ActStats
from .numerics import fake_quant_weight

GRID = 10
CLIP_GRID = tuple(1.0 - 0.05 * k for k in range(10))  # 1.0 .. 0.55


@dataclass(frozen=True)
class AwqChoice:
    scales: np.ndarray  # [K] s: weights rows multiplied by it, x divided by it
    alpha: float
    error_rtn: float    # relative output error ||X W - X Q(W)|| / ||X W|| of plain RTN on the calibration rows
    error: float        # the same with the chosen scales, before the clipping search (``written_error``: after)


def _error(x: np.ndarray, weights: Sequence[np.ndarray], refs: Sequence[np.ndarray], s: np.ndarray,
           block: int) -> float:
    xs = x / s
    num = 0.0
    for w, ref in zip(weights, refs, strict=True):
        out = xs @ fake_quant_weight(w * s[:, None], "int4-wo", block)
        num += _squares(out, ref)
    return num


def _squares(a: np.ndarray, b: np.ndarray | None = None) -> float:
    """sum((a - b) ** 2) in float64: float32 squares overflow from |a| ~ 1.8e19 (finite weights of 1e20 gave NaN
    errors and numpy overflow warnings, and the scale search compared NaNs)."""
    d = a.astype(np.float64) if b is None else np.subtract(a, b, dtype=np.float64)
    return float(np.sum(np.square(d)))


def search(stats: ActStats, weights: Sequence[np.ndarray], block: int) -> AwqChoice:
    if stats.rows is None:
        raise ValueError("AWQ needs calibration rows (collect with keep_rows=True)")
    x = stats.rows.astype(np.float32)
    refs = [x @ w for w in weights]
    denom = max(sum(_squares(r) for r in refs), 1e-30)
    mean = np.maximum(stats.mean_abs.astype(np.float64), 1e-8)
    best: tuple[float, float, np.ndarray] | None = None
    rtn = 0.0
    for a in np.linspace(0.0, 1.0, GRID, endpoint=False):
        s = np.power(mean, a)
        s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)
        err = _error(x, weights, refs, s, block)
        if a == 0.0:
            rtn = err
        if best is None or err < best[0]:
            best = (err, float(a), s)
    assert best is not None
    # ``_error`` sums squares: the report states ||out - ref|| / ||ref|| (what ``trtforge diff`` calls relative
    # error), so the ratio of sums of squares is square-rooted (it was reported squared, ~10x too small)
    return AwqChoice(best[2], best[1], float(np.sqrt(rtn / denom)), float(np.sqrt(best[0] / denom)))


def clip_search(rows: np.ndarray, w: np.ndarray, block: int) -> np.ndarray:
    """Per (block, output channel) clip ratio for the int4 range of ``w`` (already multiplied by s) given the
    migrated activations ``rows`` (x / s). Returns ``[blocks, out]`` ratios in ``CLIP_GRID``."""
    k, n = w.shape
    nb = k // block
    grams = [rows[:, b * block:(b + 1) * block].T.astype(np.float64) @ rows[:, b * block:(b + 1) * block]
             for b in range(nb)]
    best_err = np.full((nb, n), np.inf)
    best = np.ones((nb, n), np.float32)
    for r in CLIP_GRID:
        dw = (fake_quant_weight(w, "int4-wo", block, np.float32(r)) - w).astype(np.float64)
        for b in range(nb):
            d = dw[b * block:(b + 1) * block]
            err = np.einsum("kn,kn->n", d, grams[b] @ d)
            better = err < best_err[b]
            best_err[b, better] = err[better]
            best[b, better] = r
    return best


def written_error(rows: np.ndarray, weights: Sequence[np.ndarray], stored: Sequence[np.ndarray],
                  clips: Sequence[np.ndarray | None], s: np.ndarray | None, block: int) -> float:
    """``||X W - (X / s) Q(s W)|| / ||X W||`` over a group's projections on the calibration rows, with ``Q`` the
    written quantization (``stored`` = s * W, each with its clip ratios): the report's "calibration rel. error".
    ``search``'s own ``error`` is before the clipping search, which moves it (usually down, by ~10%)."""
    num = den = 0.0
    for w, ws, clip in zip(weights, stored, clips, strict=True):
        n, d = written_terms(rows, w, ws, clip, s, block)
        num += n
        den += d
    return written_ratio(num, den)


def written_terms(rows: np.ndarray, w: np.ndarray, ws: np.ndarray, clip: np.ndarray | None, s: np.ndarray | None,
                  block: int) -> tuple[float, float]:
    """One projection's share of ``written_error``: (sum of squared output errors, sum of squared outputs). Summed
    over a group in node order they give its error (``written_ratio``), so each weight can be dropped once its
    terms are known."""
    x = rows.astype(np.float32)
    xs = x if s is None else x / s
    ref = x @ w
    out = xs @ fake_quant_weight(ws, "int4-wo", block, 1.0 if clip is None else clip)
    return _squares(out, ref), _squares(ref)


def written_ratio(num: float, den: float) -> float:
    return float(np.sqrt(num / max(den, 1e-30)))
