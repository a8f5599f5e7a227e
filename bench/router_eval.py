"""Router check (issue 13): the cache-aware router against round-robin on goodput, row by row, on design and
held-out data.

Run: ``python bench/router_eval.py [--traces DIR] [--sets design,mooncake-heldout,...] [--save OUT.json]
[--compare BEFORE.json]``. Every row: cache-aware policy on every replica, goodput (TTFT <= 5 s, TPOT <= 100 ms,
over the arrival span + 300 s) behind the ``cache-aware`` router and behind ``round-robin``; ratio = CA / RR.
Sets (10-minute windows, each replayed from its own start, arrivals scaled by ``(4 / replicas) / rate`` so the
load per replica matches 4 replicas at that rate; KV = ``plan_kv``'s blocks x 1.0, 0.3, 0.15):

- ``design``: Mooncake windows 0-2, 4 replicas, rates 1x and 2x (the rows the rule was designed on);
- ``mooncake-heldout``: Mooncake windows 3.. (every later window of the trace), 4 replicas, 1x and 2x;
- ``azure``: the Azure conversation trace's windows (no prefix hashes: only load rules act), 4 replicas, 1x, 2x;
- ``rates``: Mooncake windows 0-5 at 1.5x and 3x, 4 replicas;
- ``replicas``: Mooncake windows 0-5 at 1x and 2x with 2 and with 8 replicas;
- ``extra`` (added after the rule was fixed, never used to choose it): Mooncake windows 0-5 with KV x 0.5 and 0.2
  at 1.25x and 2.5x (4 replicas), and with KV x 1.0 and 0.3 at 1x and 2x on 3 and 6 replicas.

``--save`` writes every row's numbers as JSON; ``--compare`` prints the ratio of an earlier saved run (e.g. the
router of ``main``) next to this one's, and its summary. Simulated time only: the numbers do not depend on the
machine's load. One process, one simulation at a time.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS, plan_kv
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel
from trtforge.scheduler.sim.traces import read_azure_csv, read_mooncake_jsonl

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
KV = (1.0, 0.3, 0.15)
WINDOW_S = 600.0
SETS = ("design", "mooncake-heldout", "azure", "rates", "replicas", "extra")
Row = tuple[str, str, int, float, float, int]  # (set, trace, window, kv x, rate, replicas)


def windows(reqs: list[Request]) -> list[list[Request]]:
    """The trace's 10-minute windows (the last one may be shorter), each shifted to start at 0."""
    out = []
    w = 0
    while w * WINDOW_S <= reqs[-1].arrival:
        win = [r for r in reqs if WINDOW_S * w <= r.arrival < WINDOW_S * (w + 1)]
        if win:
            t0 = win[0].arrival
            out.append([replace(r, arrival=r.arrival - t0) for r in win])
        w += 1
    return out


def rows_of(name: str, n_mooncake: int, n_azure: int) -> list[Row]:
    def grid(trace: str, wins: range, rates: tuple[float, ...], reps: tuple[int, ...],
             kvs: tuple[float, ...] = KV) -> list[Row]:
        return [(name, trace, w, kv, rate, n) for n in reps for rate in rates for w in wins for kv in kvs]

    if name == "design":
        return grid("mooncake", range(3), (1.0, 2.0), (4,))
    if name == "mooncake-heldout":
        return grid("mooncake", range(3, n_mooncake), (1.0, 2.0), (4,))
    if name == "azure":
        return grid("azure", range(n_azure), (1.0, 2.0), (4,))
    if name == "rates":
        return grid("mooncake", range(min(6, n_mooncake)), (1.5, 3.0), (4,))
    if name == "replicas":
        return grid("mooncake", range(min(6, n_mooncake)), (1.0, 2.0), (2, 8))
    if name == "extra":
        six = range(min(6, n_mooncake))
        return grid("mooncake", six, (1.25, 2.5), (4,), (0.5, 0.2)) + grid("mooncake", six, (1.0, 2.0), (3, 6),
                                                                              (1.0, 0.3))
    raise SystemExit(f"unknown set {name!r}; use {', '.join(SETS)}")


def run_row(row: Row, wins: dict[str, list[list[Request]]], blocks: int, tpb: int,
            model: StepTimeModel) -> dict[str, float]:
    _, trace, w, kv, rate, n = row
    scale = (4 / n) / rate
    reqs = [replace(r, arrival=r.arrival * scale) for r in wins[trace][w]]
    cfg = SchedulerConfig(num_blocks=max(1, int(blocks * kv)), tokens_per_block=tpb, max_seq_len=131072,
                          policy="cache-aware")
    out: dict[str, float] = {}
    for router, tag in (("cache-aware", "ca"), ("round-robin", "rr")):
        s = simulate(reqs, lambda: Scheduler(cfg), model, replicas=n, router=router, horizon_s=300.0).summary
        out[tag], out[f"{tag}_unserved"] = s.goodput_req_s, float(s.unserved)
    return out


def ratio(res: dict[str, float]) -> float:
    if res["rr"] == 0:
        return 1.0 if res["ca"] == 0 else math.inf
    return res["ca"] / res["rr"]


def key(row: Row) -> str:
    return "/".join(str(x) for x in row[1:])


def summary(label: str, rows: list[Row], res: dict[str, dict[str, float]]) -> str:
    """One line per (set, rate, replicas): rows below RR, worst and mean ratio, CA unserved in all."""
    lines = []
    groups = sorted({(r[0], r[4], r[5]) for r in rows if key(r) in res}, key=lambda g: (SETS.index(g[0]), g[2], g[1]))
    for g in groups:
        rs = [ratio(res[key(r)]) for r in rows if (r[0], r[4], r[5]) == g and key(r) in res]
        unserved = sum(res[key(r)]["ca_unserved"] for r in rows if (r[0], r[4], r[5]) == g and key(r) in res)
        lines.append(f"  {label:7s} {g[0]:17s} {g[1]:.2f}x {g[2]} replicas: {sum(x < 1 for x in rs):2d} of "
                     f"{len(rs):2d} rows below RR, worst {min(rs):.3f}, mean {sum(rs) / len(rs):.3f}, "
                     f"CA unserved {unserved:.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)} (default all)")
    ap.add_argument("--save", type=Path, default=None, help="write every row's goodputs here (JSON)")
    ap.add_argument("--compare", type=Path, default=None, help="an earlier --save file: show its ratios too")
    args = ap.parse_args(argv)
    prof, spec = load_profile("h100"), PRESETS["llama-3.1-8b"]
    kv, model = plan_kv(prof, spec), StepTimeModel.from_profile(prof, spec)
    wins = {"mooncake": windows(read_mooncake_jsonl(args.traces / "mooncake_conversation_trace.jsonl")),
            "azure": windows(read_azure_csv(args.traces / "azure_llm_2023_conv.csv"))}
    rows = [r for name in args.sets.split(",") for r in rows_of(name, len(wins["mooncake"]), len(wins["azure"]))]
    before: dict[str, dict[str, float]] = json.loads(args.compare.read_text()) if args.compare else {}
    res: dict[str, dict[str, float]] = {}
    print("set | trace | window | KV x | rate | replicas | goodput CA router | RR | CA/RR | CA unserved"
          + (" | CA/RR before" if before else ""))
    for row in rows:
        res[key(row)] = got = run_row(row, wins, kv.num_blocks, kv.tokens_per_block, model)
        old = f" | {ratio(before[key(row)]):.3f}" if key(row) in before else ""
        flag = "  BELOW RR" if got["ca"] < got["rr"] else ""
        print(f"{row[0]} | {row[1]} | {row[2]} | {row[3]:.2f} | {row[4]:g}x | {row[5]} | {got['ca']:.3f} | "
              f"{got['rr']:.3f} | {ratio(got):.3f} | {got['ca_unserved']:.0f}{old}{flag}", flush=True)
    print("\nsummary (ratio = CA router / round-robin goodput, cache-aware policy behind both)")
    print(summary("now", rows, res))
    if before:
        print(summary("before", rows, before))
    below = sum(ratio(v) < 1 for v in res.values())
    print(f"\nall: {below} of {len(res)} rows below round-robin: {'PASS' if below == 0 else 'MISS'}")
    if args.save:
        args.save.write_text(json.dumps(res, indent=0, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
