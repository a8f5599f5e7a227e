"""kv-plan numbers against hand computations, and the CLI contract."""

from __future__ import annotations

import json
import math

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import GIB, PRESETS, ModelSpec, load_model_spec, plan_kv
from trtforge_testing import assert_one_line_error


def test_llama_8b_kv_bytes_per_token_by_hand() -> None:
    spec = PRESETS["llama-3.1-8b"]
    # 2 (K,V) * 32 layers * 8 KV heads * 128 head_dim * 2 bytes
    assert spec.kv_bytes_per_token("fp16") == 2 * 32 * 8 * 128 * 2 == 131072
    assert spec.kv_bytes_per_token("fp8") == 65536
    # TP 4: two KV heads per GPU; TP 16 replicates (ceil(8/16) = 1 head).
    assert spec.kv_bytes_per_token("bf16", tp=4) == 131072 // 4
    assert spec.kv_bytes_per_token("bf16", tp=16) == 131072 // 8
    # The published parameter count of Llama-3.1-8B is 8.03 B.
    assert abs(spec.num_params / 1e9 - 8.03) < 0.01


def test_plan_h100_matches_formula() -> None:
    prof = load_profile("h100")
    spec = PRESETS["llama-3.1-8b"]
    plan = plan_kv(prof, spec, request_tokens=3000)
    gpu = int(prof.hardware.memory_gb * GIB)
    weights = spec.num_params * 2
    free = gpu - weights - plan.activation_bytes - plan.reserve_bytes
    assert plan.free_bytes == free
    kv = int(free * prof.kv.memory_fraction)
    blocks = kv // (131072 * prof.kv.tokens_per_block)
    assert plan.num_blocks == blocks > 0
    assert plan.max_tokens == blocks * prof.kv.tokens_per_block
    assert plan.requests_that_fit == blocks // math.ceil(3000 / prof.kv.tokens_per_block)
    # fp8 KV doubles the blocks (up to flooring).
    assert abs(plan_kv(prof, spec, kv_dtype="fp8").num_blocks - 2 * blocks) <= 1


def test_hf_config_and_head_dim_default(tmp_path) -> None:
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512,
           "intermediate_size": 1376, "vocab_size": 1000, "torch_dtype": "float16", "tie_word_embeddings": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model_spec(str(path))
    assert spec.head_dim == 64 and spec.num_kv_heads == 2
    # no max_position_embeddings: the 131072-token context assumed is said (it was silent), and a given one is used
    assert "no max_position_embeddings" in spec.unmodeled and spec.max_seq_len == 131072
    path.write_text(json.dumps({**cfg, "max_position_embeddings": 2048}))
    given = load_model_spec(str(path))
    assert given.max_seq_len == 2048 and "max_position_embeddings" not in given.unmodeled
    assert spec.kv_bytes_per_token("fp16") == 2 * 4 * 2 * 64 * 2
    per_layer = 512 * 8 * 64 * 2 + 512 * 2 * 64 * 2 + 3 * 512 * 1376 + 2 * 512
    assert spec.num_params == 4 * per_layer + 1000 * 512 + 512


def test_bad_configs(tmp_path) -> None:
    bad = tmp_path / "c.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not a readable JSON"):
        load_model_spec(str(bad))
    bad.write_text(json.dumps({"num_attention_heads": 8}))
    with pytest.raises(InputError, match="missing key"):
        load_model_spec(str(bad))
    with pytest.raises(InputError, match="llama-3.1-8b"):
        load_model_spec("llama-3.1-8")
    with pytest.raises(InputError):
        ModelSpec("x", 2, 6, 4, 8, 48, 64, 10)  # 6 heads not a multiple of 4 KV heads


def test_cli_json_and_text(cli, tmp_path) -> None:
    out = tmp_path / "plan.json"
    res = cli("kv-plan", "--profile", "h100", "--model", "llama-3.1-8b", "--json", out, "--request-tokens", "8192")
    assert res.code == 0, res.err
    data = json.loads(out.read_text())
    for key in ("kv_bytes_per_token", "tokens_per_block", "num_blocks", "max_tokens", "weights_bytes",
                "free_bytes", "requests_that_fit"):
        assert key in data
    assert data["kv_bytes_per_token"] == 131072
    assert str(data["num_blocks"]) in res.out


def test_cli_does_not_fit(cli, tmp_path) -> None:
    out = tmp_path / "plan.json"
    res = cli("kv-plan", "--profile", "a10", "--model", "llama-3.1-70b", "--json", out)
    assert_one_line_error(res, 2, "does not fit", "GiB", "--tp")
    assert not out.exists()
    res = cli("kv-plan", "--profile", "h100", "--model", "llama-3.1-70b", "--tp", "4")
    assert res.code == 0, res.err
    res = cli("kv-plan", "--profile", "nope", "--model", "llama-3.1-8b")
    assert_one_line_error(res, 2)


@pytest.mark.parametrize(("key", "value"), [("hidden_size", float("nan")), ("hidden_size", 0.5),
                                            ("num_attention_heads", "8")])
def test_a_head_dim_that_cannot_be_derived_names_its_key(tmp_path, key: str, value: object) -> None:
    """hidden_size NaN said 'head_dim must be a positive integer, got 0' and named no key of the config."""
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512, "intermediate_size": 1376,
           "vocab_size": 1000, "max_position_embeddings": 2048, key: value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=f"{key} must be a positive integer"):
        load_model_spec(str(path))


@pytest.mark.parametrize("spec", ["synthetic: 5", "synthetic:1_0", "synthetic:+5", "synthetic:200001",
                                  "synthetic:" + "9" * 5000, "synthetic:0"])
def test_synthetic_trace_sizes_are_digits_within_the_limit(spec: str) -> None:
    """' 5' and '1_0' passed int(); 1,000,000 requests (the old limit) passed 7.8 GB without finishing."""
    from trtforge.scheduler.sim.traces import load_trace

    with pytest.raises(InputError, match="synthetic:N|from 1 to 200,000"):
        load_trace(spec)
    assert len(load_trace("synthetic:0003")) == 3


def test_unserved_requests_are_said_on_stderr(cli, tmp_path) -> None:
    """trtllm-1.2-no-evict behind a request that never fits: exit 0, 0 of 3 completed and nothing on stderr."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5000, "output_length": 100}\n'
                     '{"timestamp": 10, "input_length": 100, "output_length": 5}\n'
                     '{"timestamp": 20, "input_length": 3000, "output_length": 2000}\n')
    res = cli("simulate", "--trace", trace, "--profile", "h100", "--model", "llama-3.1-8b", "--policy",
              "trtllm-1.2-no-evict", "--kv-scale", "0.01")
    assert res.code == 0, res.err
    assert json.loads(res.out)["unserved"] == 3
    lines = [ln for ln in res.err.splitlines() if "unserved" in ln]
    assert len(lines) == 1 and "3 of 3" in lines[0] and "never evicts" in lines[0], res.err
    ok = cli("simulate", "--trace", "synthetic:20", "--profile", "h100", "--model", "llama-3.1-8b", "--policy",
             "cache-aware")
    assert ok.code == 0 and "unserved;" not in ok.err, ok.err
