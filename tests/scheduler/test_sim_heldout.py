"""Held-out QA (session 25): traces written here in forms the project's tests never used (a byte-order mark,
CRLF line ends, timestamps across a daylight-saving change) through the real readers; kv-plan on configs with
zero fields and on tensor-parallel sizes that cannot split the heads."""

from __future__ import annotations

import json
import time

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import ModelSpec, plan_kv
from trtforge.scheduler.sim.traces import read_azure_csv, read_mooncake_jsonl

AZURE_ROWS = ["2023-11-16 18:15:46.5,374,44", "2023-11-16 18:15:47.0,10,0", "2023-11-16 18:15:48.25,20,5"]
MOONCAKE_ROWS = [{"timestamp": 0, "input_length": 1000, "output_length": 50, "hash_ids": [1, 2]},
                 {"timestamp": 2500, "input_length": 700, "output_length": 3, "hash_ids": [1, 3]}]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_traces_with_a_byte_order_mark_read_as_without(tmp_path, newline: str) -> None:
    # a spreadsheet's "CSV UTF-8" export starts with a BOM: the CSV header was refused as
    # '\ufeffTIMESTAMP,...' (printed identical to the expected one) and a JSONL's first line as invalid JSON
    csv_text = newline.join(["TIMESTAMP,ContextTokens,GeneratedTokens", *AZURE_ROWS]) + newline
    jsonl_text = newline.join(json.dumps(r) for r in MOONCAKE_ROWS) + newline
    plain_csv, bom_csv = tmp_path / "a.csv", tmp_path / "bom.csv"
    plain_jsonl, bom_jsonl = tmp_path / "m.jsonl", tmp_path / "bom.jsonl"
    plain_csv.write_bytes(csv_text.encode())
    bom_csv.write_bytes(b"\xef\xbb\xbf" + csv_text.encode())
    plain_jsonl.write_bytes(jsonl_text.encode())
    bom_jsonl.write_bytes(b"\xef\xbb\xbf" + jsonl_text.encode())
    az = read_azure_csv(bom_csv)
    assert az == read_azure_csv(plain_csv)
    assert [(r.arrival, r.prompt_tokens, r.max_new_tokens) for r in az] == [(0.0, 374, 44), (0.5, 10, 1),
                                                                            (1.75, 20, 5)]
    mc = read_mooncake_jsonl(bom_jsonl)
    assert mc == read_mooncake_jsonl(plain_jsonl)
    assert [(r.arrival, r.block_hashes) for r in mc] == [(0.0, (1, 2)), (2.5, (1, 3))]


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="needs time.tzset")
@pytest.mark.parametrize("zone", ["America/New_York", "Europe/Berlin", "UTC"])
def test_azure_arrivals_do_not_depend_on_the_machines_time_zone(tmp_path, monkeypatch, zone: str) -> None:
    # timestamps without a zone were read in the machine's local zone: across a DST change (US: 2023-03-12 02:00
    # -> 03:00) 01:59:59 -> 03:00:00 became 1 s apart instead of 3601 s, and results differed by machine
    p = tmp_path / "dst.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-03-12 01:59:59.0,10,5\n"
                 "2023-03-12 03:00:00.0,10,5\n2023-03-26 03:30:00.5,10,5\n")
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        arrivals = [r.arrival for r in read_azure_csv(p)]
    finally:
        monkeypatch.undo()
        time.tzset()
    assert arrivals == [0.0, 3601.0, 14 * 86400 + 5401.5]


SMALL = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512, "intermediate_size": 1024,
         "vocab_size": 1000}


@pytest.mark.parametrize("key", ["num_key_value_heads", "head_dim", "max_position_embeddings", "num_hidden_layers"])
def test_kv_plan_refuses_a_zero_field_naming_the_configs_key(tmp_path, key: str) -> None:
    # num_key_value_heads 0 was read as "absent" (so MHA, 8 heads: 4x the bytes per token of the GQA it may be
    # meant to be) and head_dim 0 as "derive it": a plan from a broken config, without a word
    p = tmp_path / "config.json"
    p.write_text(json.dumps(SMALL | {key: 0}))
    with pytest.raises(InputError, match=rf"config\.json: {key} must be a positive integer, got 0"):
        ModelSpec.from_hf_config(p)
    p.write_text(json.dumps(SMALL | {"num_key_value_heads": None, "head_dim": None}))  # null: HF's "absent"
    spec = ModelSpec.from_hf_config(p)
    assert (spec.num_kv_heads, spec.head_dim) == (8, 64)
    assert spec.kv_bytes_per_token("bf16") == 2 * 4 * 8 * 64 * 2


@pytest.mark.parametrize(("heads", "kv", "tp", "ok"), [(32, 8, 3, False), (32, 8, 64, False), (32, 8, 16, True),
                                                       (32, 8, 4, True), (12, 4, 8, False), (12, 4, 6, False),
                                                       (12, 1, 4, True), (12, 4, 12, True)])
def test_kv_plan_refuses_a_tp_that_cannot_split_the_heads(heads: int, kv: int, tp: int, ok: bool) -> None:
    # --tp 3 on Llama-3.1-8B (32 heads, 8 KV heads) gave a plan (ceil(8/3) = 3 KV heads a GPU) for a sharding no
    # engine can build; each KV head is replicated only when tp is a multiple of the KV heads
    spec = ModelSpec("m", 4, heads, kv, 128, heads * 128, 4096, 32000)
    profile = load_profile("h100")
    if not ok:
        with pytest.raises(InputError, match=rf"--tp {tp}: model m has {heads} attention heads and {kv} KV heads"):
            plan_kv(profile, spec, tp=tp)
        return
    plan = plan_kv(profile, spec, tp=tp)
    assert plan.kv_bytes_per_token == 2 * 4 * max(1, kv // tp) * 128 * 2


def test_a_response_cache_miss_pays_its_lookup_before_the_scheduler() -> None:
    # README: "a miss pays the measured miss time"; the replay submitted a miss at its arrival, so with a cache in
    # front every TTFT (and the goodput) was exactly the uncached run's
    from trtforge.scheduler.kv_plan import PRESETS
    from trtforge.scheduler.request import Request
    from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
    from trtforge.scheduler.sim.cache_costs import TierCosts
    from trtforge.scheduler.sim.response_cache import CacheFront
    from trtforge.scheduler.sim.simulator import simulate
    from trtforge.scheduler.sim.step_time import StepTimeModel

    miss = 0.25
    costs = TierCosts(hit={"l1": 1e-4, "l2": 3e-4}, miss=miss)
    # three distinct prompts far apart (each finds an idle replica), then a repeat of the first: an L1 hit
    reqs = [Request(f"r{i}", 100.0 * i, 700, 8, block_hashes=(i, 50 + i), hash_block_tokens=512) for i in range(3)]
    reqs.append(Request("again", 400.0, 700, 8, block_hashes=(0, 50), hash_block_tokens=512))
    cfg = SchedulerConfig(num_blocks=400, tokens_per_block=64, policy="cache-aware", max_running=8)
    model = StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])

    def ttfts(front: CacheFront | None) -> list[float]:
        return simulate(reqs, lambda: Scheduler(cfg), model, front=front, horizon_s=60).ttfts

    bare, cached = ttfts(None), ttfts(CacheFront(("l1", "l2"), costs, ttl_s=1000.0))
    assert len(bare) == len(cached) == 4
    # r0..r2 take the same time each (same prompt length on an idle replica; uncached, "again" is quicker: it
    # hits r0's prefix blocks); cached, each of them pays the miss first and "again" is an L1 hit
    assert bare[1] == pytest.approx(bare[3]) and bare[0] < bare[1]
    assert cached == pytest.approx([1e-4] + [bare[3] + miss] * 3)


def test_what_the_last_step_finishes_past_the_window_is_unserved() -> None:
    # the window's last step began inside it and ended past it: its completions counted as completed (and their
    # tokens in the throughput) though the summary says unserved = "still running at the window's end"
    from trtforge.scheduler.kv_plan import PRESETS
    from trtforge.scheduler.request import Request
    from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
    from trtforge.scheduler.sim.simulator import simulate
    from trtforge.scheduler.sim.step_time import StepTimeModel

    model = StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])
    cfg = SchedulerConfig(num_blocks=400, tokens_per_block=64, policy="cache-aware", max_running=8)
    reqs = [Request("a", 0.0, 4000, 1)]  # one prefill step of ~0.1 s, which also produces its only token
    inside = simulate(reqs, lambda: Scheduler(cfg), model, horizon_s=10.0).summary
    assert inside.completed == 1 and 0.01 < inside.ttft_p50_s < 10.0
    late = simulate(reqs, lambda: Scheduler(cfg), model, horizon_s=inside.ttft_p50_s / 2).summary
    assert (late.completed, late.unserved, late.throughput_tok_s, late.goodput_req_s) == (0, 1, 0.0, 0.0)
    assert late.ttft_p50_s == pytest.approx(inside.ttft_p50_s / 2)  # an unserved TTFT: window end - arrival


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_a_row_that_is_not_utf8_is_named_by_its_line(tmp_path, suffix: str) -> None:
    # a Latin-1 adapter name on line 3: the error named the file only ("not a text CSV file")
    good = (b"TIMESTAMP,ContextTokens,GeneratedTokens,adapter\n2023-11-16 18:15:40.0,5,3,\n"
            if suffix == "csv" else b'{"timestamp": 0, "input_length": 5, "output_length": 3}\n' * 2)
    bad = (b"2023-11-16 18:15:41.0,5,3,caf\xe9\n" if suffix == "csv"
           else b'{"timestamp": 9, "input_length": 5, "output_length": 3, "adapter": "caf\xe9"}\n')
    p = tmp_path / f"t.{suffix}"
    p.write_bytes(good + bad)
    reader = read_azure_csv if suffix == "csv" else read_mooncake_jsonl
    with pytest.raises(InputError, match=rf"t\.{suffix}:3: not UTF-8 text .*re-save it as UTF-8"):
        reader(p)
    p.write_bytes(good + bad.replace(b"\xe9", "\u00e9".encode()))
    assert reader(p)[-1].adapter == "caf\u00e9"


@pytest.mark.parametrize("name", ["t.jsonl", "t.csv", "t.jsonl.gz"])
def test_a_gzip_trace_is_named_as_such(tmp_path, name: str) -> None:
    # gzip is not a documented trace form; a compressed file was refused as "not a text file" / "unknown format"
    import gzip

    from trtforge.scheduler.sim.traces import load_trace

    p = tmp_path / name
    p.write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in MOONCAKE_ROWS)))
    with pytest.raises(InputError, match="gzip-compressed; traces are read uncompressed: gunzip it first"):
        load_trace(str(p))


@pytest.mark.parametrize(("extra", "match"), [
    ({"layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]},
     "layer_types has linear_attention layers"),
    ({"hybrid_override_pattern": "M-M*"}, "hybrid_override_pattern 'M-M\\*': a hybrid attention/state-space"),
    ({"attn_layer_period": 8, "attn_layer_offset": 4}, "attn_layer_period 8: a hybrid"),
    ({"layer_types": ["mamba", "attention", "mamba", "mamba"]}, "layer_types has mamba layers"),
])
def test_kv_plan_refuses_hybrid_layouts_naming_the_field(tmp_path, extra: dict[str, object], match: str) -> None:
    # 1 attention layer in 4 was planned as 4 attention layers: 4x the bytes per token, a quarter of the blocks
    p = tmp_path / "config.json"
    p.write_text(json.dumps(SMALL | extra))
    with pytest.raises(InputError, match=f"config.json: {match}"):
        ModelSpec.from_hf_config(p)
    # sliding-window layers are attention layers: planned as full attention (the documented lower bound)
    p.write_text(json.dumps(SMALL | {"layer_types": ["sliding_attention", "full_attention"] * 2,
                                     "sliding_window": 512}))
    assert ModelSpec.from_hf_config(p).kv_bytes_per_token("fp8") == 2 * 4 * 8 * 64


def test_kv_plan_does_not_fit_suggests_a_tp_that_splits_the_heads() -> None:
    # 40 heads, 8 KV heads: --tp 1/2/4/8/40 split them. Doubling suggested --tp 16, which no engine builds
    # ~91 B parameters: 21.3 GiB of weights a GPU at tp 8, whose activations shard to 0.7 GiB: --tp 8 plans (3
    # requests fit; the hint said --tp 40, judging tp 8 with tp 1's 2.0 GiB of activations)
    spec = ModelSpec("m", 80, 40, 8, 256, 10240, 28672, 32000)
    with pytest.raises(InputError, match=r"does not fit profile a10.*\(--tp 8 fits one 4096-token request\)"):
        plan_kv(load_profile("a10"), spec)
    assert plan_kv(load_profile("a10"), spec, tp=8).requests_that_fit >= 1
    with pytest.raises(InputError, match=r"\(not even --tp 1 fits one"):
        plan_kv(load_profile("a10"), ModelSpec("one", 80, 1, 1, 256, 10240, 28672, 32000))


def test_plot_of_a_replay_where_nothing_got_a_first_token_is_quiet(tmp_path) -> None:
    # every request rejected: the TTFT panel had no line, and matplotlib warned "No artists with labels found to
    # put in legend" on stderr of a successful run
    import warnings

    pytest.importorskip("matplotlib")
    from trtforge.scheduler.kv_plan import PRESETS
    from trtforge.scheduler.request import Request
    from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
    from trtforge.scheduler.sim.plots import plot_results
    from trtforge.scheduler.sim.simulator import simulate
    from trtforge.scheduler.sim.step_time import StepTimeModel

    model = StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])
    cfg = SchedulerConfig(num_blocks=10, tokens_per_block=64, policy="cache-aware", max_running=8)
    res = simulate([Request("big", 0.0, 5000, 8)], lambda: Scheduler(cfg), model, horizon_s=10)
    assert res.summary.rejected == 1 and not res.ttfts
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_results([("cache-aware", res)], tmp_path / "p.png")
    assert not [str(w.message) for w in caught]
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
