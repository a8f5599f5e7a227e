"""Issue 12's scale targets for ``fold``, judged in one run on the synthetic graphs of ``fold_synthetic.py``.

Targets: 100k nodes fold in under 2 s; 200k nodes take at most 2.1x the 100k time; peak memory under 3x the model's
serialized size. Each size is folded ``reps`` times with the sizes alternated (so a load change hits all sizes alike);
the median CPU time of the process (``time.process_time``) is judged, wall time is printed beside it, and so is the
load average and an anchor measured after each fold: one Python pass reading every node's op type, inputs and
outputs (fold / anchor compares machines of other speeds; the 2 s target is absolute). Memory, in one more untimed
fold per size: the growth of the resident set during fold (peak RSS ``VmHWM``, reset first through
``/proc/self/clear_refs``, minus the RSS before; Linux only), and tracemalloc's peak of Python allocations in a
separate run (tracing slows allocation, so it is never timed). Beside it, the floor of this design, each in a fresh
process: the RSS growth of a copy of the model (``fold`` returns a new model and leaves its input as it was) and of the
anchor's one Python read of every node (any rewrite in Python reads each node at least once).

Run: ``python -P bench/fold_scale.py [--reps 3] [--sizes 50000,100000,200000]`` (``bench/fold.py --only scaling``
runs the same). For a quieter figure on a shared machine: ``chrt -f 10 python -P bench/fold_scale.py``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fold_synthetic import synthetic  # noqa: E402

from trtforge.build_engine.passes import fold  # noqa: E402

TARGET_100K_S = 2.0
TARGET_RATIO = 2.1
TARGET_MEMORY = 3.0


@dataclass
class Point:
    nodes: int
    serialized: int
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    anchor: list[float] = field(default_factory=list)  # CPU s of one Python read of every node (``_anchor``)
    rss_growth: int | None = None  # bytes; None where /proc/self/clear_refs is not available
    copy_growth: int | None = None  # bytes: RSS growth of ``ModelProto.CopyFrom`` of the model alone (``_floor``)
    read_growth: int | None = None  # bytes: RSS growth of the anchor's one Python read of every node (``_floor``)
    python_peak: int = 0  # bytes


def _status_kb(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _growth(work: object) -> int | None:
    """RSS growth in bytes while ``work()`` runs (its result is kept until the peak is read), from a baseline of live
    memory; None where ``/proc/self/clear_refs`` is not available."""
    import gc

    from trtforge.build_engine.core.heap import release_free_heap

    gc.collect()
    release_free_heap()  # the baseline is live memory: freed C heap the work would reuse must not read as no growth
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
        before = _status_kb("VmRSS")
    except OSError:
        return None
    kept = work()  # type: ignore[operator]
    growth = (_status_kb("VmHWM") - before) * 1024
    del kept
    return growth


def _floor_here(n: int) -> tuple[int | None, int | None]:
    """The memory any fold of this design pays at least, in bytes: a copy of the model (``fold`` returns a new model
    and leaves its input as it was), and one Python read of every node's op type, inputs and outputs (the anchor)."""
    from onnx import ModelProto

    model = synthetic(n)

    def copy() -> ModelProto:
        work = ModelProto()
        work.CopyFrom(model)
        return work

    return _growth(copy), _growth(lambda: [(p.op_type, p.input[:], p.output[:]) for p in model.graph.node])


def _rss_growth_here(n: int) -> int | None:
    """Peak RSS during one fold of the ``n``-node graph minus the RSS before it, in bytes (in a fresh process: memory
    an earlier fold freed would otherwise be reused without growing the RSS)."""
    model = synthetic(n)
    return _growth(lambda: fold(model))


def _rss_growth(n: int) -> int | None:
    out = subprocess.run([sys.executable, "-P", __file__, "--rss-growth", str(n)], capture_output=True, text=True,
                         check=True).stdout.strip()
    return None if out == "None" else int(out)


def _floor(n: int) -> tuple[int | None, int | None]:
    out = subprocess.run([sys.executable, "-P", __file__, "--floor", str(n)], capture_output=True, text=True,
                         check=True).stdout.split()
    return (None if out[0] == "None" else int(out[0])), (None if out[1] == "None" else int(out[1]))


def _anchor(model: object) -> float:
    """CPU seconds of one Python pass reading every node's op type, inputs and outputs: the floor of any Python rewrite
    of the graph, measured beside each fold so that machines of other speeds compare by ratio."""
    c0 = time.process_time()
    rows = [(p.op_type, p.input[:], p.output[:]) for p in model.graph.node]  # type: ignore[attr-defined]
    del rows
    return time.process_time() - c0


def measure(sizes: list[int], reps: int) -> list[Point]:
    models = {n: synthetic(n) for n in sizes}
    points = {n: Point(n, len(m.SerializeToString())) for n, m in models.items()}
    fold(synthetic(1000))  # imports and schema caches, not part of any size's time
    for _ in range(reps):
        for n in sizes:
            w0, c0 = time.perf_counter(), time.process_time()
            fold(models[n])
            points[n].cpu.append(time.process_time() - c0)
            points[n].wall.append(time.perf_counter() - w0)
            points[n].anchor.append(_anchor(models[n]))
    for n in sizes:
        points[n].rss_growth = _rss_growth(n)
        points[n].copy_growth, points[n].read_growth = _floor(n)
        tracemalloc.start()
        fold(models[n])
        points[n].python_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return [points[n] for n in sizes]


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(points: list[Point], load: tuple[str, str]) -> list[str]:
    lines = [f"load average before / after: {load[0]} / {load[1]}", "",
             "| nodes | median cpu s | cpu s (each run) | median wall s | cpu us/node | anchor cpu s (fold / anchor) | "
             "serialized MB | RSS growth MB (x serialized) | Python peak MB (x serialized) |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        rss = "n/a" if p.rss_growth is None else f"{p.rss_growth / 1e6:.0f} ({p.rss_growth / p.serialized:.1f}x)"
        med = statistics.median(p.cpu)
        each = ", ".join(f"{c:.2f}" for c in p.cpu)
        anchor = statistics.median(p.anchor)
        lines.append(f"| {p.nodes:,} | {med:.2f} | {each} | {statistics.median(p.wall):.2f} | "
                     f"{med / p.nodes * 1e6:.1f} | {anchor:.3f} ({med / anchor:.1f}x) | {p.serialized / 1e6:.1f} | "
                     f"{rss} | "
                     f"{p.python_peak / 1e6:.0f} ({p.python_peak / p.serialized:.1f}x) |")
    by = {p.nodes: p for p in points}
    lines.append("")
    if 100_000 in by:
        t = statistics.median(by[100_000].cpu)
        lines.append(f"- 100k nodes in under {TARGET_100K_S:g} s: median {t:.2f} s cpu -> "
                     f"{_verdict(t < TARGET_100K_S)}")
    if 100_000 in by and 200_000 in by:
        r = statistics.median(by[200_000].cpu) / statistics.median(by[100_000].cpu)
        lines.append(f"- 200k at most {TARGET_RATIO:g}x the 100k time: {r:.2f}x -> {_verdict(r <= TARGET_RATIO)}")
    for p in points:
        if p.copy_growth is not None and p.read_growth is not None:
            lines.append(f"- {p.nodes:,} nodes, the floor of this design: a copy of the model "
                         f"{p.copy_growth / p.serialized:.1f}x serialized, one Python read of every node "
                         f"{p.read_growth / p.serialized:.1f}x" + (
                             f" (the {TARGET_MEMORY:g}x target is below either alone)"
                             if min(p.copy_growth, p.read_growth) > TARGET_MEMORY * p.serialized else ""))
        growth = p.rss_growth if p.rss_growth is not None else p.python_peak
        what = "RSS growth" if p.rss_growth is not None else "Python peak"
        lines.append(f"- {p.nodes:,} nodes, peak memory under {TARGET_MEMORY:g}x serialized: {what} "
                     f"{growth / p.serialized:.1f}x -> {_verdict(growth < TARGET_MEMORY * p.serialized)}")
    return lines


def _load() -> str:
    with open("/proc/loadavg", encoding="ascii") as fh:
        return " ".join(fh.read().split()[:3])


def run(sizes: list[int], reps: int) -> list[str]:
    before = _load()
    points = measure(sizes, reps)
    return report(points, (before, _load()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="timed folds per size (sizes alternated)")
    ap.add_argument("--sizes", default="50000,100000,200000", help="comma-separated node counts")
    ap.add_argument("--rss-growth", type=int, metavar="N", help=argparse.SUPPRESS)  # the fresh process of one size
    ap.add_argument("--floor", type=int, metavar="N", help=argparse.SUPPRESS)  # the same, for ``_floor_here``
    args = ap.parse_args()
    if args.floor:
        print(*_floor_here(args.floor))
        return 0
    if args.rss_growth:
        print(_rss_growth_here(args.rss_growth))
        return 0
    print("\n".join(run([int(s) for s in args.sizes.split(",")], args.reps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
