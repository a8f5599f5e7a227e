"""The simulator's figure: KV utilization and queue length over time, and the TTFT CDF (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def plot_results(results: Sequence[tuple[str, object]], out: str | Path) -> None:
    """``results``: (label, SimResult) pairs drawn on shared axes; written atomically to ``out`` (PNG)."""
    import logging

    # With HOME missing or read-only matplotlib warns on import (two lines on stderr of a run that succeeds) that it
    # keeps its config and font cache in a temporary folder: only slower, so those warnings are not shown.
    mpl_log = logging.getLogger("matplotlib")
    level = mpl_log.level
    mpl_log.setLevel(logging.ERROR)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    finally:
        mpl_log.setLevel(level)

    from trtforge.build_engine.core.fsutil import atomic_path

    fig, (ax_kv, ax_q, ax_cdf) = plt.subplots(3, 1, figsize=(9, 10))
    for label, res in results:
        samples = res.samples  # type: ignore[attr-defined]
        ts = [s[0] for s in samples]
        ax_kv.plot(ts, [100 * s[1] for s in samples], lw=0.8, label=label)
        ax_q.plot(ts, [s[2] for s in samples], lw=0.8, label=label)
        ttfts = res.ttfts  # type: ignore[attr-defined]
        if ttfts:
            n = len(ttfts)
            ax_cdf.plot(ttfts, [(k + 1) / n for k in range(n)], lw=1.0, label=label)
    ax_kv.set_ylabel("KV blocks used (%)")
    ax_q.set_ylabel("queued requests")
    for ax in (ax_kv, ax_q):
        ax.set_xlabel("time (s)")
        ax.legend(loc="upper right", fontsize=8)
    ax_cdf.set_xlabel("time to first token (s, first tokens inside the window)")
    ax_cdf.set_ylabel("CDF")
    if any(res.ttfts for _, res in results):  # type: ignore[attr-defined]
        ax_cdf.set_xscale("log")
        ax_cdf.legend(loc="lower right", fontsize=8)
    else:  # every request rejected or unserved: say so (an empty legend made matplotlib warn on stderr)
        ax_cdf.text(0.5, 0.5, "no request produced a first token", ha="center", va="center",
                    transform=ax_cdf.transAxes)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
