"""kv-plan on held-out HF configs: Mixtral-style MoE weights (every expert's MLP), MLA and other MoE layouts
refused with a reason instead of a plan sized as a dense Llama; GQA/MQA/head_dim/int8 numbers by hand."""

from __future__ import annotations

import json
import math

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import GIB, ModelSpec, plan_kv

MIXTRAL = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000}


def test_mixtral_counts_every_expert(tmp_path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(MIXTRAL))
    spec = ModelSpec.from_hf_config(p)
    h, inter, e = 4096, 14336, 8
    attn = h * 32 * 128 * 2 + h * 8 * 128 * 2
    assert spec.num_params == 32 * (attn + 3 * h * inter * e + h * e + 2 * h) + 2 * 32000 * h + h  # 46.7 B
    assert round(spec.num_params / 1e9, 1) == 46.7  # Mixtral-8x7B's published size (it was 7.24 B: one expert)
    with pytest.raises(InputError, match="does not fit profile h100.*--tp 2"):  # 87 GiB of bf16 weights
        plan_kv(load_profile("h100"), spec)
    assert plan_kv(load_profile("h100"), spec, tp=2).kv_bytes_per_token == 2 * 32 * 4 * 128 * 2


@pytest.mark.parametrize(("extra", "match"), [
    ({"kv_lora_rank": 512, "qk_rope_head_dim": 64}, "multi-head latent attention"),
    ({"n_routed_experts": 256, "moe_intermediate_size": 2048}, "n_routed_experts 256: this MoE layout"),
    ({"num_experts": 60, "moe_intermediate_size": 1408}, "num_experts 60: this MoE layout"),
])
def test_unmodeled_layouts_are_refused(tmp_path, extra: dict[str, int], match: str) -> None:
    cfg = {k: v for k, v in MIXTRAL.items() if k != "num_local_experts"} | extra
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=f"config.json: {match}"):
        ModelSpec.from_hf_config(p)


@pytest.mark.parametrize(("kv_heads", "head_dim", "kdt", "tp"), [(1, None, "int8", 4), (None, None, "bf16", 2),
                                                                  (16, 256, "fp8", 1), (2, None, "bf16", 4)])
def test_kv_numbers_by_hand(kv_heads: int | None, head_dim: int | None, kdt: str, tp: int) -> None:
    cfg: dict[str, object] = {"num_hidden_layers": 28, "num_attention_heads": 16, "hidden_size": 2048,
                              "intermediate_size": 8192, "vocab_size": 50000, "tie_word_embeddings": True}
    if kv_heads is not None:
        cfg["num_key_value_heads"] = kv_heads
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    plan = plan_kv(load_profile("h100"), ModelSpec.from_dict(cfg), kv_dtype=kdt, tp=tp)
    d = head_dim or 2048 // 16
    per_token = 2 * 28 * math.ceil((kv_heads or 16) / tp) * d * (2 if kdt == "bf16" else 1)
    assert plan.kv_bytes_per_token == per_token  # MQA/GQA heads replicated when tp > kv heads
    free = 80 * GIB - plan.weights_bytes - plan.activation_bytes - GIB
    assert plan.num_blocks == int(free * 0.9) // (per_token * 64)
    assert plan.max_tokens == plan.num_blocks * 64 and plan.requests_that_fit == plan.num_blocks // 64


SMALL = {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 4,
         "num_hidden_layers": 8, "vocab_size": 32000, "max_position_embeddings": 2048}


@pytest.mark.parametrize(("rope", "context"), [
    (None, 2048),
    ({"type": "linear", "factor": 4.0}, 8192),  # TensorRT-LLM stretches max_seq_len by the factor
    ({"rope_type": "dynamic", "factor": 2}, 4096),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 256}, 2048),  # already stretched
])
def test_request_tokens_bounded_by_the_models_context(tmp_path, cli, rope: dict | None, context: int) -> None:
    """A 2048-position model was planned for 4096-token requests ("1118 fit"): no engine built for it runs one.
    The default is now the context when shorter, and more than the context is refused, naming the limit."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(SMALL | {"rope_scaling": rope}))
    spec = ModelSpec.from_hf_config(p)
    assert spec.max_seq_len == context
    plan = plan_kv(load_profile("a100"), spec)
    assert plan.request_tokens == min(4096, context) and plan.max_seq_len == context
    assert plan.requests_that_fit == plan.num_blocks // math.ceil(plan.request_tokens / plan.tokens_per_block)
    assert plan_kv(load_profile("a100"), spec, request_tokens=context).request_tokens == context
    res = cli("kv-plan", "--profile", "a100", "--model", str(p), "--request-tokens", str(context + 1))
    assert res.code == 2 and f"at most {context} tokens per request" in res.err, res.err
    assert len(res.err.strip().splitlines()) == 1 and f"--request-tokens <= {context}" in res.err


@pytest.mark.parametrize("rope", [{"type": "linear", "factor": 0}, {"type": "linear", "factor": "4"}, [4]])
def test_bad_rope_scaling_is_named(tmp_path, rope: object) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(SMALL | {"rope_scaling": rope}))
    with pytest.raises(InputError, match="rope_scaling"):
        ModelSpec.from_hf_config(p)


def test_quantization_config_is_named_not_silently_ignored(tmp_path, cli) -> None:
    """A quantization_config kv-plan does not model (compressed-tensors) was planned with bf16 weights and no word:
    its KV capacity is a lower bound (and a model that fits quantized may be refused). Both now say so; the
    methods it models (AWQ, GPTQ, fp8, bitsandbytes: tests/scheduler/test_kv_quant.py) are sized as stored."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(SMALL | {"quantization_config": {"quant_method": "compressed-tensors"}}))
    assert ModelSpec.from_hf_config(p).quantization == "compressed-tensors"
    res = cli("kv-plan", "--profile", "a100", "--model", str(p))
    assert res.code == 0 and "quantization_config (compressed-tensors)" in res.err and "lower bound" in res.err, res.err
    big = tmp_path / "big.json"
    big.write_text(json.dumps(MIXTRAL | {"quantization_config": {"quant_method": "hqq", "nbits": 4}}))
    res = cli("kv-plan", "--profile", "h100", "--model", str(big))
    assert res.code == 2 and "quantization_config, hqq, is not modelled" in res.err, res.err


def test_no_fit_hint_judges_each_tp_with_its_own_activations() -> None:
    """llama-3.1-8b on h100 with --max-num-tokens 700000: 80.2 GiB of activations at tp 1, ~48 GiB at tp 2 (they
    shard). The error said "not even --tp 32 fits" (every tp judged with tp 1's activations) and did not name
    --max-num-tokens; --tp 2 plans fine."""
    from trtforge.scheduler.kv_plan import PRESETS

    h100, spec = load_profile("h100"), PRESETS["llama-3.1-8b"]
    with pytest.raises(InputError, match=r"--tp 2 fits one 4096-token request\), a smaller --max-num-tokens") as exc:
        plan_kv(h100, spec, max_num_tokens=700_000)
    assert "not even" not in exc.value.message
    assert plan_kv(h100, spec, tp=2, max_num_tokens=700_000).requests_that_fit >= 1
    with pytest.raises(InputError, match="--tp 2 fits") as exc:  # weights dominate: no --max-num-tokens advice
        plan_kv(h100, ModelSpec.from_dict(MIXTRAL))
    assert "--max-num-tokens" not in exc.value.message
