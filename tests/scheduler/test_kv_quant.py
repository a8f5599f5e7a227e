"""kv-plan sizes quantized weights (HF quantization_config) as stored: AWQ/GPTQ projections at bits/8 bytes plus
a 16-bit scale and a zero point per group, fp8 at one byte, bitsandbytes 4-bit at half a byte plus absmax; the
embeddings, LM head and norms stay in the plan's dtype. Before, every weight was sized as bf16 (a Mixtral in fp8
was refused on an 80 GB H100, where it fits)."""

from __future__ import annotations

import json

import pytest

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import GIB, ModelSpec, plan_kv

LLAMA_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "vocab_size": 128256}
PROJ = 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336)  # q, o + k, v + gate, up, down


def _spec(tmp_path, q: dict | None, base: dict = LLAMA_8B) -> ModelSpec:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(base | ({"quantization_config": q} if q else {})))
    return ModelSpec.from_hf_config(p)


@pytest.mark.parametrize("q,per_weight", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, 0.5 + 2.5 / 128),
    ({"quant_method": "awq", "w_bit": 4, "q_group_size": 64}, 0.5 + 2.5 / 64),
    ({"quant_method": "gptq", "bits": 8, "group_size": -1}, 1.0),
    ({"quant_method": "gptq", "bits": 3, "group_size": 32}, 3 / 8 + (2 + 3 / 8) / 32),
    ({"quant_method": "fp8"}, 1.0),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 0.5 + 4 / 64),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True}, 0.5 + 1 / 64),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 1.0),
])
def test_quantized_weights_by_hand(tmp_path, q: dict, per_weight: float) -> None:
    spec, plain = _spec(tmp_path, q), _spec(tmp_path, None)
    assert spec.projection_params == PROJ and spec.num_params == plain.num_params
    rest = plain.num_params - PROJ  # embeddings, LM head, norms: bf16
    plan, ref = plan_kv(load_profile("a100"), spec), plan_kv(load_profile("a100"), plain)
    assert plan.weights_bytes == int(PROJ * per_weight + rest * 2)
    assert ref.weights_bytes == plain.num_params * 2 and plan.weights_quantization and not ref.weights_quantization
    freed = ref.weights_bytes - plan.weights_bytes
    assert plan.free_bytes - ref.free_bytes == freed and plan.num_blocks > ref.num_blocks
    assert plan.num_blocks == int((plan.free_bytes * plan.memory_fraction) // plan.bytes_per_block)


def test_an_fp8_mixtral_fits_an_h100(tmp_path, cli) -> None:
    mixtral = LLAMA_8B | {"num_local_experts": 8, "vocab_size": 32000}
    p = tmp_path / "mixtral.json"
    p.write_text(json.dumps(mixtral | {"quantization_config": {"quant_method": "fp8"}}))
    res = cli("kv-plan", "--profile", "h100", "--model", str(p))
    assert res.code == 0, res.err
    assert "fp8 projections, bf16 others" in res.out and "lower bound" not in res.err
    spec = _spec(tmp_path, {"quant_method": "fp8"}, mixtral)
    assert spec.weights_bytes("bf16") / GIB == pytest.approx((spec.projection_params + 2 * (spec.num_params -
                                                              spec.projection_params)) / GIB)
    p.write_text(json.dumps(mixtral))
    assert cli("kv-plan", "--profile", "h100", "--model", str(p)).code == 2  # bf16: 87 GiB of weights


@pytest.mark.parametrize("q", [{"quant_method": "awq", "bits": 4, "group_size": 0}, {"quant_method": "gptq"},
                               {"quant_method": "awq", "bits": True}, "yes"])
def test_configs_without_what_the_size_needs_are_not_modelled(tmp_path, q: object) -> None:
    spec = _spec(tmp_path, q)  # type: ignore[arg-type]
    assert spec.quantization and spec.weight_quant is None
    assert plan_kv(load_profile("a100"), spec).weights_bytes == spec.num_params * 2
