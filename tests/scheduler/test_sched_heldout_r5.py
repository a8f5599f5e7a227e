"""Held-out QA round 5: the scheduler, the simulator and its CLI on inputs the other tests never used."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel
from trtforge.scheduler.sim.traces import read_azure_csv, read_mooncake_jsonl
from trtforge_testing import assert_one_line_error

MODEL = StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])


@pytest.mark.parametrize("cap", ["\u00b2", "\u0663", "\uff15"])
def test_max_tokens_of_non_ascii_digits_is_one_line_exit_2(cli, cap: str) -> None:
    """--max-tokens is plain ASCII digits: a superscript two crashed (exit 3, int() refused what isdigit()
    accepted), an Arabic-Indic or fullwidth digit was read as a cap of 3 or 5."""
    res = cli("simulate", "--trace", "synthetic:5", "--profile", "h100", "--model", "llama-3.1-8b",
              "--policy", "cache-aware", "--max-tokens", cap)
    assert_one_line_error(res, 2, "--max-tokens")


def test_max_requests_keeps_the_earliest_arrivals_of_an_unsorted_trace(tmp_path: Path) -> None:
    """--max-requests N is the N earliest requests, in time order, whatever order the rows are in: the first N
    rows of the file were kept, so an unsorted trace replayed later requests and dropped the first ones."""
    rows = [(7, 100), (1, 200), (9, 300), (1, 400), (0, 500), (5, 600), (3, 700)]  # (seconds, prompt tokens)
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps({"timestamp": s * 1000, "input_length": n, "output_length": 2}) + "\n"
                             for s, n in rows))
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{s:02d},{n},2\n" for s, n in rows))
    for reader in (read_mooncake_jsonl, read_azure_csv):
        path = jsonl if reader is read_mooncake_jsonl else csv
        every = reader(path)
        for n in range(1, len(rows) + 2):
            got = reader(path, max_requests=n)
            assert got == every[:n], (reader.__name__, n)
        # earliest first, ties in file order, seconds from the earliest arrival
        assert [(r.arrival, r.prompt_tokens) for r in reader(path, max_requests=4)] == [
            (0.0, 500), (1.0, 200), (1.0, 400), (3.0, 700)]
        assert len({r.id for r in every}) == len(rows)


LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
            "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072}


@pytest.mark.parametrize("command", ["kv-plan", "simulate"])
def test_rope_factor_that_leaves_no_context_is_one_line_exit_2(cli, tmp_path: Path, command: str) -> None:
    """A rope_scaling factor so small that max_position_embeddings x factor is under one token: kv-plan crashed
    (exit 3, ZeroDivisionError dividing by the 0-token context); now both commands name the key."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_8B, "rope_scaling": {"type": "linear", "factor": 1e-9}}))
    extra = ["--trace", "synthetic:5", "--policy", "cache-aware"] if command == "simulate" else []
    res = cli(command, "--profile", "h100", "--model", config, *extra)
    assert_one_line_error(res, 2, "rope_scaling factor")


@pytest.mark.parametrize("policy", ["vllm-v1", "trtllm-main-no-evict"])
def test_vllm_v1_passes_over_a_request_whose_adapter_gets_no_slot(policy: str) -> None:
    """vLLM v1's waiting loop skips a request whose LoRA would exceed max_loras and goes on to the next one
    (``continue``, before the KV lookup); vllm-v1 stopped there, so a base-model request waited behind it for the
    whole decode of the request holding the only slot. The TensorRT-LLM policies keep their head-of-line wait."""
    cfg = SchedulerConfig(num_blocks=100, tokens_per_block=16, policy=policy, token_budget=64, max_running=8,
                          lora_slots=1, adapters=("A", "B"))
    s = Scheduler(cfg)
    s.submit(Request("a", 0.0, 16, 50, adapter="A"))
    s.step()
    assert s.state("a") == "running"
    for r in (Request("b", 0.0, 16, 4, adapter="B"), Request("base", 0.0, 16, 4), Request("a2", 0.0, 16, 4,
                                                                                            adapter="A")):
        s.submit(r)
    admitted = s.step().admitted + s.step().admitted
    if policy == "vllm-v1":
        assert admitted == ["base", "a2"] and s.state("b") == "queued"  # B waits for A's slot, nobody behind it
    else:
        assert admitted == [] and {s.state(r) for r in ("b", "base", "a2")} == {"queued"}
    while s.running or s.queue:  # every request still completes: b once a's requests free the slot
        s.step()
    assert all(s.state(r) == "finished" for r in ("a", "b", "base", "a2")) and s.used_blocks == 0


@pytest.mark.parametrize("replicas", [1, 2])
def test_simulate_refuses_two_requests_under_one_id(replicas: int) -> None:
    """Per-request records are keyed by id: two requests named alike on two replicas overwrote each other's times
    and lengths, so the summary lost one (3 requests, 2 completed, 0 unserved); on one replica the second arrival
    failed the replay midway. Now the trace is refused before anything runs."""
    cfg = SchedulerConfig(num_blocks=100, tokens_per_block=16)
    reqs = [Request("x", 0.0, 100, 5), Request("y", 0.1, 20, 5), Request("x", 0.05, 50, 50)]
    with pytest.raises(InputError, match="request id 'x' appears twice"):
        simulate(reqs, partial(Scheduler, cfg), MODEL, replicas=replicas, max_tokens="oracle")
    unique = [r for r in reqs if r.max_new_tokens == 5]
    ok = simulate(unique, partial(Scheduler, cfg), MODEL, replicas=replicas, max_tokens="oracle").summary
    assert ok.completed == 2


def test_cancel_updates_the_gauges_and_counts_the_slot_wait() -> None:
    """Cancelling the last requests of an idle server left the gauges at their old values (4 used blocks, 1
    running, 1 queued) until a step that never came, and a cancelled request's wait for a LoRA slot (with its KV
    available) was not counted in slot_wait_s; finish already refreshed the gauges."""
    now = [0.0]
    cfg = SchedulerConfig(num_blocks=20, tokens_per_block=4, max_running=4, token_budget=64, lora_slots=1,
                          adapters=("A", "B"))
    s = Scheduler(cfg, metrics=True, clock=lambda: now[0])
    s.submit(Request("a", 0.0, 8, 8, adapter="A"))
    s.step()
    s.submit(Request("b", 0.0, 8, 8, adapter="B"))  # KV fits, the only slot is A's
    s.step()
    now[0] = 5.0
    s.step()
    assert s.metrics is not None and s.metrics.sample("trtforge_scheduler_used_blocks") == 4
    s.cancel("b")
    s.cancel("a")
    assert s.slot_wait_s == 5.0
    for gauge in ("used_blocks", "running_requests", "queued_requests"):
        assert s.metrics.sample(f"trtforge_scheduler_{gauge}") == 0, gauge
    assert s.metrics.sample("trtforge_scheduler_free_blocks") == 20 and s.used_blocks == 0


def test_a_system_message_after_the_question_is_keyed_where_it_stands() -> None:
    """System messages were keyed as a set apart from the turns: [system, user] and [user, system] (an instruction
    the client appends after the question), or a system message before or after an earlier turn, had one key, so
    the cache served the answer of the other prompt. Leading system messages keep the keys they had."""
    from trtforge.scheduler.cache.keys import make_key

    sys_ = {"role": "system", "content": "Answer in German."}
    q, earlier = {"role": "user", "content": "Translate: good morning"}, {"role": "user", "content": "Hi"}
    asst = {"role": "assistant", "content": "Hello!"}

    def key(*msgs: dict[str, str], **kw: str) -> str:
        return make_key({"model": "m", "temperature": 0, "messages": list(msgs), **kw}).digest

    assert key(sys_, q) != key(q, sys_)
    assert key(sys_, earlier, asst, q) != key(earlier, asst, sys_, q) != key(earlier, sys_, asst, q)
    assert key(sys_, q, conversation_id="c") != key(q, sys_, conversation_id="c")
    # a leading system prompt: pinned (key version 2: temperature and top_p exact)
    assert key(sys_, q) == "63faa0b28830f7e6a77b37144e570e7d833b22c8e6321cf414c018c9326093dd"


@pytest.mark.parametrize("path", ["/l", "/cache", "/1/2"])
def test_a_redis_url_path_that_is_not_a_database_number_is_refused(cli, path: str) -> None:
    """redis-py reads a URL path that is not a number as database 0 ('/l', a typo of '/1') and '/1/2' as database 12,
    silently: 'cache ping' said ok and 'cache invalidate' published to another database than the replicas', whose
    stored cache version it did not change. Now the CLI and CacheConfig refuse it with one line."""
    from trtforge.scheduler.cache.entry import CacheConfig

    url = f"redis://127.0.0.1:1{path}"
    res = cli("cache", "ping", "--redis-url", url)
    assert_one_line_error(res, 2, "not a database number")
    with pytest.raises(InputError, match="not a database number"):
        CacheConfig(layers=("l1", "l2"), redis_url=url)
    CacheConfig(layers=("l1", "l2"), redis_url="redis://127.0.0.1:1/3")  # a number, or no path, is a database
    CacheConfig(layers=("l1", "l2"), redis_url="redis://127.0.0.1:1")


@pytest.mark.parametrize("head_dim", [1, 5])
def test_kv_scale_hint_above_the_block_limit_is_one_that_fits(cli, tmp_path: Path, head_dim: int) -> None:
    """A config whose plan exceeds the simulator's block limit is refused with a --kv-scale to use; '.2g' rounded
    that scale up (0.0335 -> 0.034: 10,138,534 blocks, refused again with the same hint). Now it is rounded down."""
    import re

    from trtforge.build_engine.cli.simulate import MAX_KV_BLOCKS

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
                                  "head_dim": head_dim, "hidden_size": 64, "intermediate_size": 64, "vocab_size": 100,
                                  "max_position_embeddings": 4096}))
    res = cli("simulate", "--trace", "synthetic:3", "--profile", "h100", "--model", config, "--policy", "cache-aware")
    assert_one_line_error(res, 2, "--kv-scale")
    got = re.search(r"gives (\d+) blocks .* --kv-scale ([0-9.e-]+) ", res.err)
    assert got is not None, res.err
    planned, scale = int(got.group(1)), float(got.group(2))
    assert planned > MAX_KV_BLOCKS and planned * scale <= MAX_KV_BLOCKS and planned * scale > 0.9 * MAX_KV_BLOCKS
