"""SmoothQuant (Xiao et al., 2023) migration scales for W8A8: move activation outliers into the weights.

For the projections reading one activation ``x`` (q/k/v share the attention norm's output), per input channel j:
``s_j = max|x_j| ** alpha / max_over_group_weights max|W[j, :]| ** (1 - alpha)``; the weights become ``s_j * W[j, :]``
and ``x`` is divided by ``s`` before its quantizer (``migrate`` inserts that Mul on the projections' edge only).
The product is unchanged in exact arithmetic; quantization error is what moves. Channels that never fire
(max|x_j| = 0) and all-zero weight rows keep s_j = 1; s is clipped to [1e-4, 1e4] so no channel is scaled into
fp32's denormals or overflow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .calibrators import ActStats


def smooth_scales(stats: ActStats, weights: Sequence[np.ndarray], alpha: float) -> np.ndarray:
    w_amax = np.max(np.stack([np.abs(w).max(1) for w in weights]), axis=0)
    x_amax = stats.amax.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.power(x_amax, alpha) / np.power(w_amax.astype(np.float64), 1.0 - alpha)
    ok = (x_amax > 0) & (w_amax > 0) & np.isfinite(s)
    return np.clip(np.where(ok, s, 1.0), 1e-4, 1e4).astype(np.float32)


def smoothed_amax(stats: ActStats, s: np.ndarray) -> float:
    """Per-tensor max |x / s| after migration (the max calibrator's range, from the same statistics)."""
    return float(np.max(stats.amax / s))


def plan(groups: Mapping[str, Sequence[np.ndarray]], stats: Mapping[str, ActStats],
         alpha: float) -> dict[str, np.ndarray]:
    """Activation name -> s for each group of projections sharing it."""
    return {x: smooth_scales(stats[x], ws, alpha) for x, ws in groups.items()}
