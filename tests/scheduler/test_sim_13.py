"""Issue 13's realistic simulation: the cap, one metrics window, goodput, adapters, the router."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from functools import partial

import pytest

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel
from trtforge.scheduler.sim.traces import assign_adapters, read_azure_csv, read_mooncake_jsonl, synthetic_trace
from trtforge_testing import assert_one_line_error


def _model() -> StepTimeModel:
    return StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])


def _cfg(policy: str = "cache-aware", blocks: int = 40, **kw: object) -> SchedulerConfig:
    kw.setdefault("max_seq_len", 4096)
    return SchedulerConfig(num_blocks=blocks, tokens_per_block=64, policy=policy, max_running=16,
                           **kw)  # type: ignore[arg-type]


def test_scheduler_sees_only_the_cap_and_reserves_to_it() -> None:
    """Two requests, prompt 300, true output 20. Cap 2048 -> 37 blocks each to completion: one at a time in a
    40-block cache. Oracle (cap = 20) -> 5 blocks each: both at once. The output is 20 tokens either way."""
    reqs = [Request("a", 0.0, 300, 20), Request("b", 0.0, 300, 20)]
    seen: list[Scheduler] = []

    def make(cfg: SchedulerConfig) -> Scheduler:
        seen.append(Scheduler(cfg))
        return seen[-1]

    capped = simulate(reqs, partial(make, _cfg()), _model(), max_tokens="2048", horizon_s=60)
    assert {q.req.max_new_tokens for q in seen[-1].seqs.values()} == {2048}  # the true 20 never reaches it
    oracle = simulate(reqs, partial(make, _cfg()), _model(), max_tokens="oracle", horizon_s=60)
    ctx = simulate(reqs, partial(make, _cfg(blocks=200)), _model(), max_tokens="context", horizon_s=60)
    assert {q.req.max_new_tokens for q in seen[-1].seqs.values()} == {4096 - 300}
    for res in (capped, oracle, ctx):
        assert res.summary.completed == 2
        assert res.summary.throughput_tok_s * res.summary.duration_s == pytest.approx(40)
    t_cap, t_or = sorted(capped.ttfts), sorted(oracle.ttfts)
    assert t_or[1] < 0.5 * t_cap[1]  # with the cap, b waited for a to finish all 20 tokens


def test_cap_truncates_longer_outputs() -> None:
    res = simulate([Request("a", 0.0, 100, 500)], partial(Scheduler, _cfg()), _model(), max_tokens="64",
                   horizon_s=60).summary
    assert res.completed == 1 and res.throughput_tok_s * res.duration_s == pytest.approx(64)


def test_one_window_for_every_policy_and_unserved_are_misses() -> None:
    """A never-fit request first: trtllm-1.2 stalls with everything unserved; the window (arrival span 0.19 s +
    horizon 30 s) is the same for both policies, and the stalled one's TTFT p50 is about the window."""
    reqs = [Request("huge", 0.0, 5000, 100)] + [Request(f"r{k}", 0.01 * k, 300, 20) for k in range(1, 20)]
    out = {p: simulate(reqs, partial(Scheduler, _cfg(p, max_seq_len=8192)), _model(), horizon_s=30,
                       max_tokens="oracle").summary for p in ("trtllm-1.2-no-evict", "cache-aware")}
    stalled, served = out["trtllm-1.2-no-evict"], out["cache-aware"]
    assert stalled.duration_s == served.duration_s == pytest.approx(30.19)
    assert stalled.unserved == 20 and stalled.completed == 0 and stalled.goodput_req_s == 0
    assert served.unserved == 0 and served.rejected == 1 and served.completed == 19
    assert served.req_per_s == pytest.approx(19 / 30.19)
    assert stalled.ttft_p50_s > 29.9  # never-served requests count to the end of the window
    assert served.goodput_req_s == pytest.approx(19 / 30.19)


def test_goodput_counts_only_requests_within_both_slos() -> None:
    reqs = [Request(f"r{k}", 0.0, 200, 30) for k in range(4)]
    base = simulate(reqs, partial(Scheduler, _cfg()), _model(), max_tokens="oracle", horizon_s=10)
    ttft = max(base.ttfts)
    tight = simulate(reqs, partial(Scheduler, _cfg()), _model(), max_tokens="oracle", horizon_s=10,
                     slo_ttft_s=ttft * 0.999).summary
    loose = simulate(reqs, partial(Scheduler, _cfg()), _model(), max_tokens="oracle", horizon_s=10,
                     slo_ttft_s=ttft * 1.001, slo_tpot_s=base.summary.tpot_p50_s * 1.001).summary
    no_tpot = simulate(reqs, partial(Scheduler, _cfg()), _model(), max_tokens="oracle", horizon_s=10,
                       slo_ttft_s=10, slo_tpot_s=base.summary.tpot_p50_s * 0.5).summary
    window = base.summary.duration_s
    assert tight.goodput_req_s < 4 / window and loose.goodput_req_s == pytest.approx(4 / window)
    assert no_tpot.goodput_req_s == 0


def test_adapters_from_trace_zipf_and_slot_stats(tmp_path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "adapter": "x"}\n'
                 '{"timestamp": 1, "input_length": 10, "output_length": 5}\n')
    assert [r.adapter for r in read_mooncake_jsonl(p)] == ["x", None]
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,adapter\n2023-11-16 18:15:46.1,10,5,y\n"
                   "2023-11-16 18:15:47.2,10,5,\n")
    assert [r.adapter for r in read_azure_csv(csv)] == ["y", None]
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "adapter": 3}\n')
    with pytest.raises(Exception, match="t.jsonl:1: adapter must be"):
        read_mooncake_jsonl(p)
    reqs = assign_adapters(synthetic_trace(600, seed=3), 8, seed=5)
    assert reqs == assign_adapters(synthetic_trace(600, seed=3), 8, seed=5)
    counts = Counter(r.adapter for r in reqs)
    assert counts["adapter-0"] > 2 * counts["adapter-3"] > 0  # Zipf: 1 vs 1/4
    alt = [Request(f"r{k}", 0.0, 100, 40, adapter="ab"[k % 2]) for k in range(6)]
    one = simulate(alt, partial(Scheduler, _cfg(lora_slots=1, adapters=("a", "b"))), _model(),
                   max_tokens="oracle").summary
    two = simulate(alt, partial(Scheduler, _cfg(lora_slots=2, adapters=("a", "b"))), _model(),
                   max_tokens="oracle").summary
    assert one.completed == two.completed == 6
    assert two.adapter_loads == 2 and two.slot_hits == 4 and two.slot_wait_s == 0
    assert one.slot_wait_s > 0 and one.adapter_loads >= 2


def test_cli_simulate_new_flags(cli, tmp_path) -> None:
    out = tmp_path / "sim.json"
    res = cli("simulate", "--trace", "synthetic:120", "--profile", "h100", "--model", "llama-3.1-8b",
              "--policy", "vllm-v1", "--max-tokens", "oracle", "--adapters", "4", "--lora-slots", "2",
              "--router", "cache-aware", "--replicas", "2", "--slo-ttft", "3", "--json", out)
    assert res.code == 0, res.err
    data = json.loads(out.read_text())
    assert data["max_tokens"] == "oracle" and data["lora_slots"] == 2 and data["slo_ttft_s"] == 3
    assert data["unserved"] + data["completed"] + data["rejected"] == 120 and data["goodput_req_s"] >= 0
    assert data["adapter_loads"] >= 4
    for bad in (("--max-tokens", "lots"), ("--max-tokens", "0"), ("--slo-tpot", "-1")):
        res = cli("simulate", "--trace", "synthetic:10", "--profile", "h100", "--model", "llama-3.1-8b",
                  "--policy", "cache-aware", *bad)
        assert_one_line_error(res, 2, bad[0])


@pytest.mark.parametrize("policy", ["cache-aware", "vllm-v1", "trtllm-main-no-evict"])
def test_fast_forward_is_exact(policy: str) -> None:
    """Quiet decode steps replayed in bulk give the same summary as stepping each one."""
    reqs = assign_adapters(synthetic_trace(150, rate=3.0, seed=4), 3, seed=1)
    cfg = SchedulerConfig(num_blocks=900, tokens_per_block=64, policy=policy, max_running=32, lora_slots=2,
                          adapters=("adapter-0", "adapter-1", "adapter-2"))
    fast, slow = (simulate(reqs, partial(Scheduler, cfg), _model(), replicas=2, router="cache-aware",
                           horizon_s=60, fast_forward=ff).summary for ff in (True, False))
    # the KV-utilization integral is summed in another order (frac * sum(dt) vs sum(frac * dt)): last digits only
    assert fast.kv_utilization_mean == pytest.approx(slow.kv_utilization_mean, rel=1e-12)
    assert replace(fast, kv_utilization_mean=0.0) == replace(slow, kv_utilization_mean=0.0)
    assert fast.completed > 100
