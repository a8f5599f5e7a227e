"""Simulator behaviour and the ``trtforge simulate`` CLI contract."""

from __future__ import annotations

import dataclasses
import json
import math
from functools import partial

import pytest

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.simulator import calibrate, percentile, simulate
from trtforge.scheduler.sim.step_time import StepTimeModel
from trtforge.scheduler.sim.traces import synthetic_trace
from trtforge_testing import assert_one_line_error

KEYS = ("policy", "requests", "completed", "rejected", "preempted", "throughput_tok_s", "ttft_p50_s",
        "ttft_p99_s", "tpot_p50_s", "kv_utilization_mean", "prefix_hit_rate")


def _model() -> StepTimeModel:
    return StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])


def test_step_time_roofline_regimes() -> None:
    m = _model()
    one = m.step_seconds([], 1000, 1)
    # decode is memory-bound: ~16 GB of bf16 weights / (3.35 TB/s * 0.8) + overhead
    assert abs(one - (m.weights_bytes / (3350e9 * 0.8) + m.overhead_s)) / one < 0.02
    # doubling a compute-bound prefill roughly doubles its time; doubling a small decode batch barely moves it
    p1, p2 = m.step_seconds([(0, 4096)], 0, 0), m.step_seconds([(0, 8192)], 0, 0)
    assert 1.8 < (p2 - m.overhead_s) / (p1 - m.overhead_s) < 2.5
    assert m.step_seconds([], 2000, 2) / one < 1.05


def test_never_fit_under_fcfs_terminates_and_reports_stuck() -> None:
    reqs = [Request("huge", 0.0, 5000, 100)] + [Request(f"r{k}", 0.01 * k, 300, 20) for k in range(1, 20)]
    out = {}
    for policy in ("fcfs-no-evict", "cache-aware"):
        cfg = SchedulerConfig(num_blocks=40, tokens_per_block=64, policy=policy, max_running=16)
        out[policy] = simulate(reqs, partial(Scheduler, cfg), _model(), horizon_s=30).summary
    assert out["fcfs-no-evict"].stuck == 20 and out["fcfs-no-evict"].completed == 0
    assert out["cache-aware"].rejected == 1 and out["cache-aware"].completed == 19
    assert out["cache-aware"].rejected_by_kind == {"kv-never-fits": 1}


# The ``trtforge simulate --json`` keys the summary owns, in order (the CLI appends its run context after them).
SUMMARY_KEYS = ("policy", "replicas", "requests", "completed", "rejected", "rejected_by_kind", "preempted", "stuck",
                "stuck_ids", "duration_s", "req_per_s", "throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                "kv_utilization_mean", "prefix_hit_rate", "steps", "num_blocks_per_replica", "tokens_per_block",
                # issue 13 adds these after today's keys
                "goodput_req_s", "unserved", "slo_ttft_s", "slo_tpot_s", "max_tokens", "lora_slots", "adapter_loads",
                "slot_hits", "slot_wait_s")


def test_summary_is_frozen_and_to_json_keeps_the_keys() -> None:
    reqs = [Request("huge", 0.0, 5000, 100)] + [Request(f"r{k}", 0.01 * k, 300, 20) for k in range(1, 5)]
    cfg = SchedulerConfig(num_blocks=40, tokens_per_block=64, policy="fcfs-no-evict", max_running=16)
    summ = simulate(reqs, partial(Scheduler, cfg), _model(), horizon_s=5).summary
    with pytest.raises(dataclasses.FrozenInstanceError):
        summ.completed = 1  # type: ignore[misc]
    data = summ.to_json()
    assert tuple(data) == SUMMARY_KEYS
    assert summ.completed == 0 and math.isnan(summ.tpot_p50_s) and data["tpot_p50_s"] is None  # NaN -> null
    assert data["stuck_ids"] == ["huge", "r1", "r2", "r3", "r4"]
    assert json.loads(json.dumps(data, allow_nan=False)) == data


def test_metrics_queue_wait_in_simulated_seconds() -> None:
    reqs = [Request(f"r{k}", 0.0, 3000, 50) for k in range(6)]  # 4 fit at once; 2 wait for the first to finish
    scheds: list[Scheduler] = []
    cfg = SchedulerConfig(num_blocks=200, tokens_per_block=64, policy="cache-aware", max_running=16)

    def make() -> Scheduler:
        scheds.append(Scheduler(cfg, metrics=True))
        return scheds[-1]

    res = simulate(reqs, make, _model()).summary
    m = scheds[0].metrics
    assert res.completed == 6
    assert m.sample("trtforge_scheduler_queue_wait_seconds_count") == 6
    waited = m.sample("trtforge_scheduler_queue_wait_seconds_sum")
    assert waited > 0 and waited <= 2 * res.duration_s
    assert m.sample("trtforge_scheduler_used_blocks") == 0  # nothing leaked at the end


def test_prefix_affinity_routes_conversations_together() -> None:
    reqs = synthetic_trace(300, rate=6.0, seed=1)
    rates = {}
    for router in ("round-robin", "prefix-affinity"):
        cfg = SchedulerConfig(num_blocks=3000, tokens_per_block=64, policy="cache-aware")
        rates[router] = simulate(reqs, partial(Scheduler, cfg), _model(), replicas=4, router=router).summary
    assert rates["prefix-affinity"].prefix_hit_rate > rates["round-robin"].prefix_hit_rate
    assert rates["prefix-affinity"].completed == 300


def test_calibration_ratio_is_reported() -> None:
    cal = calibrate(load_profile("h100"))
    assert cal["published_output_tok_s"] == 15270.02
    assert cal["ratio_model_over_published"] == cal["model_output_tok_s"] / 15270.02 > 0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_cli_simulate_json_and_plot(cli, tmp_path) -> None:
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    res = cli("simulate", "--trace", "synthetic:150", "--profile", "h100", "--model", "llama-3.1-8b",
              "--policy", "cache-aware", "--replicas", "2", "--router", "prefix-affinity", "--kv-scale", "0.2",
              "--json", out, "--plot", png)
    assert res.code == 0, res.err
    data = json.loads(out.read_text())
    for key in KEYS:
        assert key in data
    assert data["requests"] == 150 and data["completed"] + data["rejected"] + data["stuck"] == 150
    assert data["preempted"] == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_simulate_errors(cli, tmp_path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    res = cli("simulate", "--trace", bad, "--profile", "h100", "--model", "llama-3.1-8b", "--policy", "cache-aware")
    assert_one_line_error(res, 2, "t.jsonl:1", "input_length")
    res = cli("simulate", "--trace", "synthetic", "--profile", "h100", "--model", "llama-3.1-8b", "--policy", "lifo")
    assert_one_line_error(res, 2, "--policy")


def test_cli_max_num_tokens_is_token_budget(cli, tmp_path) -> None:
    """kv-plan's (and TensorRT-LLM's) --max-num-tokens is simulate's --token-budget under another name: the alias
    gives the same run (it was a usage error)."""
    runs = []
    for flag in ("--token-budget", "--max-num-tokens"):
        out = tmp_path / f"{flag.strip('-')}.json"
        res = cli("simulate", "--trace", "synthetic:60", "--profile", "h100", "--model", "llama-3.1-8b",
                  "--policy", "cache-aware", flag, "512", "--json", out)
        assert res.code == 0, res.err
        runs.append(json.loads(out.read_text()))
    assert runs[0] == runs[1]
    default = tmp_path / "default.json"
    assert cli("simulate", "--trace", "synthetic:60", "--profile", "h100", "--model", "llama-3.1-8b",
               "--policy", "cache-aware", "--json", default).code == 0
    assert json.loads(default.read_text())["ttft_p99_s"] != runs[0]["ttft_p99_s"]  # 512 is not the default 8192


def test_cli_time_scale_past_float_range_is_refused(cli, tmp_path) -> None:
    """--time-scale 1e308 on a 9 s trace: the later arrivals became infinite and were never submitted (exit 0, two of
    three requests 'unserved', an infinite window); now exit 2 naming the flag, nothing written, for any window past
    where a float holds a step's milliseconds."""
    trace, out = tmp_path / "t.jsonl", tmp_path / "o.json"
    trace.write_text("".join(json.dumps({"timestamp": ms, "input_length": 10, "output_length": 3}) + "\n"
                             for ms in (0, 5000, 9000)))
    args = ("simulate", "--trace", trace, "--profile", "h100", "--model", "llama-3.1-8b", "--policy", "cache-aware")
    res = cli(*args, "--time-scale", "1e308", "--json", out)
    assert_one_line_error(res, 2, "--time-scale")
    assert not out.exists()
    # 1e300: finite, but the 600 s horizon rounded away and the last arrival was never served
    assert_one_line_error(cli(*args, "--time-scale", "1e300", "--json", out), 2, "--time-scale")
    assert_one_line_error(cli(*args, "--horizon", "1e13", "--json", out), 2, "--horizon")
    res = cli(*args, "--time-scale", "1e8", "--json", out)  # a window of 9e8 s: still exact, every request served
    assert res.code == 0, res.err
    data = json.loads(out.read_text())
    assert data["completed"] == 3 and data["unserved"] == 0
