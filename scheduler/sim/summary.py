"""What one replay measured, over ONE window for every policy.

The window is the arrival span plus the drain horizon (``first arrival .. last arrival + horizon_s``), whatever
the policy did: a policy that stalls after a few completions is divided by the same seconds as one that served
everything (dividing by the time of the last completion flattered stalls). Requests never served in the window
(``unserved``: still queued or running at its end) count as SLO misses, and their TTFT counts as (window end -
arrival) in the percentiles. Rejected requests are counted apart and miss the SLO too.

Goodput (the headline): completed requests per second of the window whose TTFT <= ``slo_ttft_s`` AND whose
TPOT <= ``slo_tpot_s`` (TPOT = (completion - first token) / (output tokens - 1), DistServe's definition).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method); NaN for no values."""
    if not values:
        return math.nan
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass(frozen=True)
class SimSummary:
    """What one replay measured (times in simulated seconds; NaN where there was nothing to measure)."""

    policy: str
    replicas: int
    requests: int
    completed: int
    rejected: int
    rejected_by_kind: dict[str, int]  # rejection kind -> count
    preempted: int
    stuck: int  # still queued or running at the end of the window (== unserved)
    stuck_ids: tuple[str, ...]  # the first 20 of them
    duration_s: float  # the window: arrival span + drain horizon, the same for every policy
    req_per_s: float
    throughput_tok_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    kv_utilization_mean: float
    prefix_hit_rate: float
    steps: int
    num_blocks_per_replica: int
    tokens_per_block: int
    goodput_req_s: float
    unserved: int
    slo_ttft_s: float
    slo_tpot_s: float
    max_tokens: str  # the cap mode: a number, "context" or "oracle"
    lora_slots: int
    adapter_loads: int
    slot_hits: int
    slot_wait_s: float

    def to_json(self) -> dict[str, Any]:
        """The ``trtforge simulate --json`` keys, in field order; NaN becomes ``null`` (strict JSON)."""
        out = asdict(self)
        out["stuck_ids"] = list(self.stuck_ids)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


@dataclass(frozen=True)
class Outcome:
    """Per-request times the replay recorded (simulated seconds) and output lengths actually produced."""

    first: Mapping[str, float]
    done: Mapping[str, float]
    rejected: Mapping[str, str]  # id -> rejection kind
    out_len: Mapping[str, int]


def summarize(reqs: Sequence[Any], sched_stats: Mapping[str, Any], out: Outcome, t_start: float,
              window_end: float, slo: tuple[float, float]) -> dict[str, Any]:
    """The measured fields of ``SimSummary`` (the caller adds the run's configuration)."""
    # the window's last step may end past it: what it finished (or started) then is outside the window, unserved
    first = {rid: t for rid, t in out.first.items() if t <= window_end}
    done = {rid: t for rid, t in out.done.items() if t <= window_end}
    stuck = [r.id for r in reqs if r.id not in done and r.id not in out.rejected]
    ttft = [first[r.id] - r.arrival if r.id in first else window_end - r.arrival for r in reqs
            if r.id not in out.rejected]
    tpot: dict[str, float] = {rid: (done[rid] - first[rid]) / (out.out_len[rid] - 1) for rid in done
                              if out.out_len[rid] > 1 and rid in first}
    window = max(window_end - t_start, 1e-9)
    arrival = {r.id: r.arrival for r in reqs}
    good = sum(1 for rid in done if rid in first and first[rid] - arrival[rid] <= slo[0]
               and tpot.get(rid, 0.0) <= slo[1])
    kinds: dict[str, int] = {}
    for k in out.rejected.values():
        kinds[k] = kinds.get(k, 0) + 1
    return dict(
        requests=len(reqs), completed=len(done), rejected=len(out.rejected), rejected_by_kind=kinds,
        stuck=len(stuck), stuck_ids=tuple(stuck[:20]), duration_s=window, req_per_s=len(done) / window,
        throughput_tok_s=sum(out.out_len[rid] for rid in done) / window, ttft_p50_s=percentile(ttft, 50),
        ttft_p99_s=percentile(ttft, 99), tpot_p50_s=percentile(list(tpot.values()), 50),
        goodput_req_s=good / window, unserved=len(stuck), slo_ttft_s=slo[0], slo_tpot_s=slo[1], **sched_stats)
