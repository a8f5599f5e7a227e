"""Held-out QA round 7: kv-plan and simulate on huge values, and the scheduler on shapes the other tests never used."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS, ModelSpec
from trtforge.scheduler.kv_weights import valid_tps
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel
from trtforge_testing import assert_one_line_error, seeded_rng

LLAMA_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192}


def _long_int(label: str) -> str:
    """A random integer of 4301..6000 digits: json refuses to convert it (ValueError, not JSONDecodeError)."""
    rng = seeded_rng(label)
    n = int(rng.integers(4301, 6000))
    return str(int(rng.integers(1, 10))) + "".join(map(str, rng.integers(0, 10, n - 1)))


@pytest.mark.parametrize("field", ["timestamp", "input_length", "hash_ids"])
def test_a_trace_integer_of_more_than_4300_digits_is_one_line_exit_2(cli, tmp_path: Path, field: str) -> None:
    """A Mooncake row holding an integer of more than 4300 digits crashed simulate (exit 3, json's ValueError
    'Exceeds the limit (4300 digits)' is not a JSONDecodeError); now the row is named."""
    big = _long_int(f"trace-{field}")
    row = {"timestamp": 1000, "input_length": 700, "output_length": 4, "hash_ids": [3, 9]}
    text = json.dumps(row).replace("[3, 9]" if field == "hash_ids" else str(row[field]),
                                  f"[{big}, 9]" if field == "hash_ids" else big, 1)
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({**row, "timestamp": 0}) + "\n" + text + "\n")
    res = cli("simulate", "--trace", trace, "--profile", "h100", "--model", "llama-3.1-8b", "--policy", "cache-aware")
    assert_one_line_error(res, 2, f"{trace}:2")


@pytest.mark.parametrize("kind", ["digits", "nested"])
def test_an_unreadable_config_is_one_line_exit_2(cli, tmp_path: Path, kind: str) -> None:
    """kv-plan --model with a 4301-digit integer or arrays nested 10^5 deep: exit 3 (ValueError, RecursionError)."""
    config = tmp_path / "config.json"
    if kind == "digits":
        config.write_text(json.dumps(LLAMA_8B).replace("8192", _long_int("config-digits"), 1))
    else:
        depth = int(seeded_rng("config-nested").integers(50_000, 100_000))
        config.write_text(json.dumps(LLAMA_8B)[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}")
    res = cli("kv-plan", "--profile", "h100", "--model", config)
    assert_one_line_error(res, 2, "not a readable JSON config")


@pytest.mark.parametrize("extra", [{"hidden_size": 10**400, "head_dim": 128}, {"vocab_size": 10**400},
                                   {"intermediate_size": 10**400}, {"head_dim": 10**400},
                                   {"max_position_embeddings": 10**400}, {"num_local_experts": 10**400},
                                   {"rope_scaling": {"type": "linear", "factor": 1e308}},
                                   {"num_attention_heads": 10**20, "num_key_value_heads": 10**20, "head_dim": 1,
                                    "hidden_size": 1}])
@pytest.mark.parametrize("command", ["kv-plan", "simulate"])
def test_huge_config_values_are_one_line_exit_2(cli, tmp_path: Path, extra: dict[str, object], command: str) -> None:
    """A config dimension of 10**400 crashed kv-plan and simulate (exit 3, OverflowError in the float sizes), a
    rope factor of 1e308 made the context infinite (exit 3); 10**20 heads are refused as well (the --tp search
    looped over every integer up to the head count: it never ended)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_8B, **extra}))
    more = ["--trace", "synthetic:5", "--policy", "cache-aware"] if command == "simulate" else []
    start = time.monotonic()
    res = cli(command, "--profile", "h100", "--model", config, *more)
    assert time.monotonic() - start < 10
    assert_one_line_error(res, 2, "config.json")


def test_a_large_head_count_is_planned_in_seconds(cli, tmp_path: Path) -> None:
    """10**8 heads (under the int32 bound): the --tp search looped over every integer up to the head count, twice
    (the --tp check and the no-fit hint), tens of seconds; now over its divisors."""
    config = tmp_path / "config.json"
    heads = 10**8 + int(seeded_rng("many-heads").integers(0, 4)) * 2 * 10**7
    config.write_text(json.dumps({**LLAMA_8B, "num_attention_heads": heads, "num_key_value_heads": heads,
                                  "head_dim": 1, "hidden_size": 64}))
    start = time.monotonic()
    res = cli("kv-plan", "--profile", "h100", "--model", config)
    assert time.monotonic() - start < 5
    assert_one_line_error(res, 2, "does not fit", "--tp")


def test_valid_tps_are_the_head_splits() -> None:
    """``valid_tps`` (now through the divisors of the head count) against the brute force it replaced."""
    rng = seeded_rng("valid-tps")
    for _ in range(200):
        kv = int(rng.integers(1, 40))
        q = kv * int(rng.integers(1, 12))
        spec = ModelSpec("m", 2, q, kv, 64, 256, 512, 1000)
        brute = [t for t in range(1, q + 1) if not q % t and not (kv % t if t <= kv else t % kv)]
        assert valid_tps(spec) == brute, (q, kv)


def test_huge_awq_group_size_is_named_as_not_modelled(cli, tmp_path: Path) -> None:
    """An AWQ group_size of 10**400 crashed kv-plan (exit 3, OverflowError in its overhead); it is now a
    quantization_config the plan does not model (weights sized as bf16, a warning)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_8B, "quantization_config": {"quant_method": "awq", "bits": 4,
                                                                      "group_size": 10**400}}))
    res = cli("kv-plan", "--profile", "h100", "--model", config)
    assert res.code == 0, res.err
    assert "does not model" in res.err


def test_kv_plan_huge_max_num_tokens_and_memory_are_one_line_exit_2(cli, tmp_path: Path) -> None:
    """kv-plan --max-num-tokens 10**400 and a profile of 1e300 GiB crashed (exit 3, OverflowError); simulate
    bounds its --max-num-tokens already."""
    res = cli("kv-plan", "--profile", "h100", "--model", "llama-3.1-8b", "--max-num-tokens", str(10**400))
    assert_one_line_error(res, 2, "--max-num-tokens")
    h100 = Path(__file__).resolve().parents[2] / "profiles" / "h100.toml"
    profile = tmp_path / "big.toml"
    profile.write_text(h100.read_text().replace("memory_gb = 80.0", "memory_gb = 1e300"))
    res = cli("kv-plan", "--profile", profile, "--model", "llama-3.1-8b")
    assert_one_line_error(res, 2, "memory_gb")


def _model() -> StepTimeModel:
    return StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])


@pytest.mark.parametrize("policy", ["trtllm-1.2-no-evict", "cache-aware", "max-utilization", "vllm-v1"])
def test_kv_utilization_counts_a_capped_requests_last_step(policy: str) -> None:
    """One request alone, its prompt and output inside the same last block (so a policy that grows blocks holds as
    many as one that reserves them), holds ceil(prompt / 16) blocks in every step it runs: the mean KV use over the
    busy time is exactly that over the pool. A request that reached its cap freed its blocks before its last step
    was counted (3 steps: 2/3 of it); one that ended at end-of-sequence was counted whole."""
    rng = seeded_rng(f"kv-use-{policy}")
    rest = int(rng.integers(1, 9))
    prompt, out = 16 * int(rng.integers(2, 6)) + rest, int(rng.integers(2, 16 - rest))
    blocks = -(-prompt // 16)
    assert blocks == -(-(prompt + out + 1) // 16)  # a cap one above the output reserves no more
    cfg = SchedulerConfig(num_blocks=20, tokens_per_block=16, policy=policy)
    for cap in ("oracle", str(out + 1)):  # it stops at its cap, or at end-of-sequence one token before it
        res = simulate([Request("a", 1.0, prompt, out)], partial(Scheduler, cfg), _model(), horizon_s=10,
                       max_tokens=cap)
        assert res.summary.completed == 1
        assert res.summary.kv_utilization_mean == pytest.approx(blocks / 20, rel=1e-12), cap


@pytest.mark.parametrize("policy", ["max-utilization", "vllm-v1"])
def test_kv_utilization_does_not_depend_on_how_a_request_ends(policy: str) -> None:
    """Policies that grow blocks as tokens come make the same schedule whether a request stops at its cap
    (oracle) or at end-of-sequence under a larger cap; the mean KV use differed (the capped ones' last step was
    not counted)."""
    rng = seeded_rng(f"kv-use-ends-{policy}")
    reqs = [Request(f"r{i}", float(rng.uniform(0, 0.05)), int(rng.integers(50, 600)), int(rng.integers(2, 30)))
            for i in range(8)]
    cfg = SchedulerConfig(num_blocks=2000, tokens_per_block=16, policy=policy)
    a, b = (simulate(reqs, partial(Scheduler, cfg), _model(), horizon_s=10, max_tokens=cap).summary
            for cap in ("oracle", "2048"))
    assert (a.completed, a.steps, a.ttft_p50_s, a.tpot_p50_s) == (b.completed, b.steps, b.ttft_p50_s, b.tpot_p50_s)
    assert a.kv_utilization_mean == pytest.approx(b.kv_utilization_mean, rel=1e-12)


@pytest.mark.parametrize("limit", [5, 37, 120])
def test_plot_samples_span_the_whole_replay(limit: int) -> None:
    """The plot's samples are bounded (``max_samples``) but cover the replay to its end: the first ``max_samples``
    were kept and the rest dropped, so the full Azure trace's KV and queue curves stopped at 1,431 s of 3,504 s.
    Against the unbounded samples of the same replay: a subsequence, in time order, whose last one is within one
    sampling stride of the end."""
    rng = seeded_rng(f"plot-samples-{limit}")
    reqs = [Request(f"r{i}", float(rng.uniform(0, 20)), int(rng.integers(20, 3000)), int(rng.integers(1, 200)))
            for i in range(300)]
    cfg = SchedulerConfig(num_blocks=400, tokens_per_block=16, policy="cache-aware")
    full = simulate(reqs, partial(Scheduler, cfg), _model(), max_samples=10**9).samples
    got = simulate(reqs, partial(Scheduler, cfg), _model(), max_samples=limit).samples
    assert len(full) > 4 * limit
    assert 0 < len(got) <= limit
    where = {s: k for k, s in enumerate(full)}
    at = [where[s] for s in got]
    assert at == sorted(at) and len(set(at)) == len(at)
    assert at[-1] >= len(full) - 1 - 2 * len(full) // limit, (at[-1], len(full))


def test_the_block_limit_counts_every_replica(cli, tmp_path: Path) -> None:
    """The simulator's KV-block limit bounded one replica's pool only: --replicas 1024 (accepted) of a 2.3M-block
    model built 1024 pools, ~120 GB (killed for memory). All replicas' blocks together are bounded now; the hint's
    --kv-scale and --replicas fit. (5 replicas here: the old code then runs, ~0.6 GB, instead of refusing.)"""
    import re

    from trtforge.build_engine.cli.simulate import MAX_KV_BLOCKS

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({**LLAMA_8B, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "head_dim": 32, "hidden_size": 128,
                                  "intermediate_size": 256, "vocab_size": 1000}))
    n = 5
    res = cli("simulate", "--trace", "synthetic:3", "--profile", "a100", "--model", config, "--policy", "cache-aware",
              "--replicas", str(n))
    assert_one_line_error(res, 2, "--kv-scale", "--replicas", f"x {n} replicas")
    got = re.search(r"gives (\d+) blocks .* --kv-scale ([0-9.e-]+), at most --replicas (\d+),", res.err)
    assert got is not None, res.err
    blocks, scale, most = int(got.group(1)), float(got.group(2)), int(got.group(3))
    assert blocks * n > MAX_KV_BLOCKS >= int(blocks * scale) * n > 0.9 * MAX_KV_BLOCKS
    assert most * blocks <= MAX_KV_BLOCKS < (most + 1) * blocks


def test_a_huge_lora_slot_pool_costs_no_memory() -> None:
    """The slot pool listed every never-used slot: --lora-slots 10**9 built a list of 10**9 numbers (40 GB). Now a
    count; slots are still handed out 0, 1, 2, ... and reclaimed least recently unpinned first."""
    import tracemalloc

    from trtforge.scheduler.lora_slots import LoraSlots

    rng = seeded_rng("lora-slots")
    names = [f"a{k}" for k in range(int(rng.integers(5, 9)))]
    tracemalloc.start()
    try:
        slots = LoraSlots(10**12, names)
        assert [slots.acquire(a) for a in names] == list(range(len(names)))
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
    small = LoraSlots(2, names)
    assert (small.acquire(names[0]), small.acquire(names[1])) == (0, 1)
    assert not small.can_acquire(names[2])
    small.release(names[1])
    small.release(names[0])
    assert small.acquire(names[2]) == 1  # the least recently unpinned slot goes first


def test_adapters_beyond_the_limit_are_refused(cli) -> None:
    """--adapters K held K popularity weights and names: 10**8 was ~16 GB. Bounded at 10**6, one line exit 2 (just
    above it here: the old code ran that, ~0.2 GB, and exited 0)."""
    k = 10**6 + 1 + int(seeded_rng("adapters").integers(0, 10**5))
    res = cli("simulate", "--trace", "synthetic:3", "--profile", "h100", "--model", "llama-3.1-8b",
              "--policy", "cache-aware", "--adapters", str(k))
    assert_one_line_error(res, 2, "--adapters")


def test_a_timestamp_past_float_range_is_one_line_exit_2(cli, tmp_path: Path) -> None:
    """A Mooncake timestamp that is an integer past float's range (under json's 4300 digits) crashed simulate
    (exit 3, OverflowError in math.isfinite); now the row is named."""
    digits = int(seeded_rng("timestamp-range").integers(310, 4300))
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 700, "output_length": 4}\n'
                     f'{{"timestamp": 1{"0" * digits}, "input_length": 700, "output_length": 4}}\n')
    res = cli("simulate", "--trace", trace, "--profile", "h100", "--model", "llama-3.1-8b", "--policy", "cache-aware")
    assert_one_line_error(res, 2, f"{trace}:2", "timestamp")


def _fcfs_reference(reqs: list[Request], model: StepTimeModel, cfg: SchedulerConfig,
                    cap: int) -> tuple[dict[str, float], dict[str, float], float]:
    """trtllm-1.2-no-evict on one replica, written out plainly (no prefix hashes): arrivals up to the clock join the
    queue; admit in order while prompt + cap blocks fit; one step = every decode token plus prefill chunks in
    admission order within the token budget; a request ends at min(cap, its output). (first token, done) by id, and
    the mean fraction of blocks held while a step runs, over the busy time."""
    need = {r.id: -(-(r.prompt_tokens + cap) // cfg.tokens_per_block) for r in reqs}
    todo = sorted(reqs, key=lambda r: r.arrival)
    clock, free = todo[0].arrival, cfg.num_blocks
    queue: list[Request] = []
    running: list[list[Any]] = []  # [request, prompt tokens computed, tokens generated]
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    held = busy = 0.0
    while todo or queue or running:
        if not queue and not running:
            clock = max(clock, todo[0].arrival)
        while todo and todo[0].arrival <= clock:
            queue.append(todo.pop(0))
        while queue and len(running) < cfg.max_running and need[queue[0].id] <= free:
            free -= need[queue[0].id]
            running.append([queue.pop(0), 0, 0])
        decoding = [s for s in running if s[2] >= 1]
        left, chunks = cfg.token_budget - len(decoding), []
        for s in running:
            if s[2] == 0 and left > 0:
                chunks.append((s, s[1], min(s[0].prompt_tokens - s[1], left)))
                left -= chunks[-1][2]
        if not chunks and not decoding:
            break  # a never-fit request at the head of the queue: it waits forever
        ctx = sum(s[0].prompt_tokens + s[2] for s in decoding)
        dt = model.step_seconds([(a, n) for _, a, n in chunks], ctx, len(decoding))
        clock, busy, held = clock + dt, busy + dt, held + (cfg.num_blocks - free) / cfg.num_blocks * dt
        for s in decoding:
            s[2] += 1
        for s, _, n in chunks:
            s[1] += n
            if s[1] == s[0].prompt_tokens:
                s[2], first[s[0].id] = 1, clock
        for s in [s for s in running if s[2] >= min(s[0].max_new_tokens, cap)]:
            done[s[0].id] = clock
            running.remove(s)
            free += need[s[0].id]
    return first, done, held / busy if busy else 0.0


@pytest.mark.parametrize("case", range(12))
def test_fcfs_replay_equals_a_plain_reference(case: int) -> None:
    """Held-out shapes (bursts at one timestamp, unsorted rows, prompts at and one over a block, caps that cut
    outputs, never-fit requests, tiny budgets) replayed by the simulator give the TTFTs, completions, TPOT, last
    completion and mean KV use of the plain reference above, to rounding."""
    rng = seeded_rng(f"fcfs-reference-{case}")
    tpb, nb, running = int(rng.choice([1, 4, 16, 64])), int(rng.integers(5, 80)), int(rng.integers(1, 6))
    cap = int(rng.integers(1, nb * tpb // 2 + 1))
    cfg = SchedulerConfig(num_blocks=nb, tokens_per_block=tpb, policy="trtllm-1.2-no-evict",
                          token_budget=int(rng.integers(running, 3000)), max_running=running)
    times = np.cumsum(rng.exponential(0.3, 25) * (rng.random(25) < 0.5))
    prompts = [int(rng.choice([tpb, tpb + 1, max(1, nb * tpb - cap), rng.integers(1, max(2, nb * tpb - cap))]))
               for _ in times]
    reqs = [Request(f"r{k}", float(t), p, int(rng.integers(1, cap + 4)))
            for k, (t, p) in enumerate(zip(times, prompts, strict=True))]
    reqs = [reqs[k] for k in rng.permutation(len(reqs))]
    res = simulate(reqs, partial(Scheduler, cfg), _model(), horizon_s=1e6, max_tokens=str(cap))
    first, done, kv_use = _fcfs_reference(reqs, _model(), cfg, cap)
    arrival = {r.id: r.arrival for r in reqs}
    assert res.ttfts == pytest.approx(sorted(first[r] - arrival[r] for r in first), rel=1e-9, abs=1e-12)
    assert res.summary.completed == len(done)
    out = {r.id: min(r.max_new_tokens, cap) for r in reqs}
    tpot = [(done[r] - first[r]) / (out[r] - 1) for r in done if out[r] > 1]
    if tpot:
        assert res.summary.tpot_p50_s == pytest.approx(float(np.median(tpot)), rel=1e-9)
    if done:
        assert res.last_completion_s == pytest.approx(max(done.values()) - min(arrival.values()), rel=1e-9)
    assert res.summary.kv_utilization_mean == pytest.approx(kv_use, rel=1e-9)
