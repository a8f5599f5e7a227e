"""Held-out QA round 6: kv-plan on configs users bring (Gemma's implicit tied head, multimodal text_config) and
Azure CSV traces as other exports write them (columns reordered, a UTC offset on the timestamps)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.scheduler.kv_plan import ModelSpec
from trtforge.scheduler.sim.traces import read_azure_csv, read_mooncake_jsonl
from trtforge_testing import assert_one_line_error, seeded_rng


def _gemma(rng, model_type: str) -> dict[str, Any]:
    """A Gemma-shaped config.json: head_dim given (not hidden / heads) and no tie_word_embeddings key."""
    heads = int(rng.choice([8, 16]))
    return {"architectures": ["GemmaForCausalLM"], "model_type": model_type, "head_dim": 256,
            "hidden_size": int(rng.integers(8, 32)) * 128, "intermediate_size": int(rng.integers(40, 200)) * 128,
            "num_attention_heads": heads, "num_key_value_heads": heads // int(rng.choice([1, 2])),
            "num_hidden_layers": int(rng.integers(10, 46)), "vocab_size": 256000, "max_position_embeddings": 8192}


@pytest.mark.parametrize("model_type", ["gemma", "gemma2"])
def test_gemma_without_the_tie_key_shares_its_lm_head(model_type: str) -> None:
    """Gemma's config.json omits tie_word_embeddings and transformers' Gemma config ties by default: the head was
    counted as a second vocab x hidden matrix (gemma-7b: 9.32 B parameters, 1.5 GiB of bf16 weights too many)."""
    cfg = _gemma(seeded_rng(f"gemma-{model_type}"), model_type)
    h, d, layers = cfg["hidden_size"], 256, cfg["num_hidden_layers"]
    q, kv, inter = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    per_layer = 2 * h * q * d + 2 * h * kv * d + 3 * h * inter + 2 * h
    by_hand = layers * per_layer + 256000 * h + h  # one embedding, shared by the head
    spec = ModelSpec.from_dict(cfg)
    assert spec.num_params == by_hand
    assert spec.kv_bytes_per_token("bf16") == 2 * layers * kv * d * 2
    assert ModelSpec.from_dict({**cfg, "tie_word_embeddings": False}).num_params == by_hand + 256000 * h
    llama = {**cfg, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    assert ModelSpec.from_dict(llama).num_params == by_hand + 256000 * h  # Llama's default stays untied


def _decoder(rng) -> dict[str, int]:
    heads = int(rng.choice([16, 32]))
    return {"hidden_size": heads * 128, "intermediate_size": int(rng.integers(60, 120)) * 128,
            "num_attention_heads": heads, "num_key_value_heads": heads // int(rng.choice([1, 4])),
            "num_hidden_layers": int(rng.integers(16, 40)), "vocab_size": int(rng.integers(32000, 130000)),
            "max_position_embeddings": 4096}


def test_multimodal_config_plans_its_text_config_and_says_what_it_leaves_out(tmp_path: Path, cli) -> None:
    """A Llava config nests the decoder under text_config: kv-plan refused it with "missing key
    'num_attention_heads'"; it now plans the decoder as the same keys at the top level would, and warns that the
    vision tower's weights are not counted."""
    text = _decoder(seeded_rng("llava"))
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
                             "text_config": {"model_type": "llama", **text},
                             "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24}}))
    flat = ModelSpec.from_dict(text)
    spec = ModelSpec.from_hf_config(p)
    assert (spec.num_params, spec.kv_bytes_per_token("fp16")) == (flat.num_params, flat.kv_bytes_per_token("fp16"))
    assert spec.unmodeled and "vision_config" in spec.unmodeled
    res = cli("kv-plan", "--profile", "h100", "--model", p)
    assert res.code == 0 and f"{flat.kv_bytes_per_token('bf16')} bytes" in res.out
    assert "text_config" in res.err and "upper bound" in res.err


def test_mllama_cross_attention_layers_are_refused_naming_the_field(tmp_path: Path, cli) -> None:
    """Mllama's cross-attention layers cache the image's K/V: sizing them as text-token K/V is refused, by name."""
    text = {**_decoder(seeded_rng("mllama")), "cross_attention_layers": [3, 8, 13, 18]}
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "mllama", "text_config": text}))
    with pytest.raises(InputError, match="cross_attention_layers"):
        ModelSpec.from_hf_config(p)
    assert_one_line_error(cli("kv-plan", "--profile", "h100", "--model", p), 2, "cross_attention_layers")
    p.write_text(json.dumps({"model_type": "mllama_text_model", **text}))  # the text model's own config
    assert_one_line_error(cli("kv-plan", "--profile", "h100", "--model", p), 2, "cross_attention_layers")


def _azure_rows(label: str, n: int = 6) -> list[tuple[int, int, int, int]]:
    rng = seeded_rng(label)
    return [(k, int(rng.integers(0, 10**6)), int(rng.integers(1, 4000)), int(rng.integers(0, 500)))
            for k in range(n)]


def test_azure_columns_are_found_by_name_in_any_order(tmp_path: Path) -> None:
    """A CSV with the same columns in another order (as a spreadsheet or pandas export writes it) was refused
    (exit 2, 'header must be TIMESTAMP,ContextTokens,GeneratedTokens'); it reads as the canonical order does."""
    rows = _azure_rows("azure-order")
    canon, moved = tmp_path / "a.csv", tmp_path / "b.csv"
    canon.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{s:02d}.{f:06d},{c},{g}\n" for s, f, c, g in rows))
    moved.write_text("GeneratedTokens,Extra,ContextTokens,TIMESTAMP\r\n" + "".join(
        f"{g},x{c},{c},2023-11-16 18:15:{s:02d}.{f:06d}\r\n" for s, f, c, g in rows))
    assert read_azure_csv(moved) == read_azure_csv(canon)
    short = tmp_path / "c.csv"
    short.write_text(moved.read_text() + "7,y,12\n")
    with pytest.raises(InputError, match=r"c\.csv:8: expected at least 4 fields"):
        read_azure_csv(short)


def test_azure_2024_timestamps_with_a_utc_offset(tmp_path: Path) -> None:
    """The Azure 2024 traces write '2024-05-10 00:00:00.009930+00:00': the offset made every row exit 2; it is
    read and applied (a +01:00 time is an hour earlier in UTC)."""
    rows = _azure_rows("azure-2024")
    plain, zoned = tmp_path / "a.csv", tmp_path / "b.csv"
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    plain.write_text(head + "".join(f"2024-05-10 00:00:{s:02d}.{f:06d},{c},{g}\n" for s, f, c, g in rows))
    zoned.write_text(head + "".join(f"2024-05-10 {'01' if k % 2 else '00'}:00:{s:02d}.{f:06d}"
                                    f"{'+01:00' if k % 2 else '+00:00'},{c},{g}\n"
                                    for k, (s, f, c, g) in enumerate(rows)))
    assert read_azure_csv(zoned) == read_azure_csv(plain)


@pytest.mark.parametrize(("extra", "warned"), [({"sliding_window": 4096}, True),
                                               ({"sliding_window": 4096, "use_sliding_window": False}, False),
                                               ({"sliding_window": None}, False),
                                               ({"sliding_window": 1 << 20}, False)])
def test_a_sliding_window_planned_as_full_attention_is_said(tmp_path: Path, cli, extra: dict[str, Any],
                                                            warned: bool) -> None:
    """A Mistral-v0.1 / Gemma-2 sliding window is planned as full attention (a conservative plan): kv-plan said
    nothing of it; it now warns, and only when the window is in use and shorter than the context."""
    cfg = {**_decoder(seeded_rng("sliding")), "max_position_embeddings": 32768, **extra}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    res = cli("kv-plan", "--profile", "h100", "--model", p)
    assert res.code == 0
    assert f"{ModelSpec.from_dict(cfg).kv_bytes_per_token('bf16')} bytes" in res.out
    assert ("sliding_window 4096" in res.err and "full attention" in res.err) is warned


def test_mooncake_null_hash_ids_read_as_absent(tmp_path: Path) -> None:
    """An optional field written as null (as exporters write a missing value) is the field left out: hash_ids null
    exited 2 ('must be a list of integers') though adapter null and a row without hash_ids were both read."""
    rng = seeded_rng("mooncake-null")
    rows = [{"timestamp": k * int(rng.integers(1, 900)), "input_length": int(rng.integers(1, 5000)),
             "output_length": int(rng.integers(0, 400))} for k in range(5)]
    bare, nulls = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    bare.write_text("".join(json.dumps(r) + "\n" for r in rows))
    nulls.write_text("".join(json.dumps({**r, "hash_ids": None, "adapter": None}) + "\n" for r in rows))
    assert read_mooncake_jsonl(nulls) == read_mooncake_jsonl(bare)


def test_a_vision_tower_beside_a_top_level_decoder_is_said(tmp_path: Path, cli) -> None:
    """Qwen2-VL writes the decoder's keys at the top level and the vision tower under vision_config: the plan
    left the tower's weights out without a word; it now warns, and the decoder's numbers are unchanged."""
    text = _decoder(seeded_rng("qwen2-vl"))
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "qwen2_vl", **text, "vision_config": {"depth": 32, "embed_dim": 1280}}))
    spec = ModelSpec.from_hf_config(p)
    assert spec.num_params == ModelSpec.from_dict(text).num_params and "vision_config" in spec.unmodeled
    res = cli("kv-plan", "--profile", "h100", "--model", p)
    assert res.code == 0 and "vision_config" in res.err and "upper bound" in res.err
    assert ModelSpec.from_dict(text).unmodeled == ""


@pytest.mark.parametrize(("extra", "warned"), [({"sliding_window": 4096}, True), ({"sliding_window": None}, False)])
def test_simulate_says_what_its_kv_plan_leaves_out(tmp_path: Path, cli, extra: dict[str, Any], warned: bool) -> None:
    """simulate plans its KV cache as kv-plan does but printed none of kv-plan's warnings: a sliding window planned
    as full attention made the simulated capacity a bound without a word."""
    cfg = {**_decoder(seeded_rng("sliding-sim")), "max_position_embeddings": 32768, **extra}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    res = cli("simulate", "--trace", "synthetic:5", "--profile", "h100", "--model", p, "--policy", "vllm-v1")
    assert res.code == 0, res.err
    assert ("sliding_window 4096" in res.err and "full attention" in res.err) is warned
