"""KV-cache capacity of a decoder on a GPU profile (``trtforge kv-plan``; COMMON interface 7).

The formula follows TensorRT-LLM's family (``KvCacheConfig.free_gpu_memory_fraction``): after the weights are
loaded and a peak-sized forward pass has run, the KV cache takes ``fraction`` of the memory that is still free::

    free_bytes   = GPU memory - weights/tp - activation peak - runtime reserve
    kv_bytes     = free_bytes * kv.memory_fraction
    block_bytes  = kv_bytes_per_token_per_gpu * tokens_per_block
    num_blocks   = floor(kv_bytes / block_bytes);  max_tokens = num_blocks * tokens_per_block

``kv_bytes_per_token = 2 (K and V) * layers * kv_heads * head_dim * dtype bytes`` for the whole model; with tensor
parallelism each GPU holds ``ceil(kv_heads / tp)`` heads (heads are replicated when ``tp > kv_heads``), so every
GPU holds the same number of blocks and the token capacity is per model replica. A config's ``sliding_window`` is not
used: every layer is planned as full attention (a request's blocks grow with all its tokens), so for sliding-window
models the capacity is a lower bound (kv-plan warns).

TensorRT-LLM *measures* the activation peak with a dummy forward; we estimate it (documented in
``activation_bytes``), so the result is a plan, not a promise: expect a few percent of difference.
``Hardware.memory_gb`` is read as GiB (2**30 bytes): HBM sizes are powers of two (an "80 GB" H100 shows 81559 MiB
in nvidia-smi).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtforge.build_engine.core.errors import InputError
from trtforge.build_engine.core.jsonout import unique_keys, unreadable

from .hf_config import context_note, decoder_config, sliding_note, tied
from .kv_fit import no_fit
from .kv_weights import (
    DTYPE_BYTES,
    GIB,
    KV_DTYPES,
    RUNTIME_RESERVE_BYTES,
    WeightQuant,
    activation_bytes,
    projection_params,
    valid_tps,
    weights_bytes,
)

#: Largest dimension (and context, ``max_seq_len``) a config may give: int32, as TensorRT-LLM sizes them.
MAX_DIM = 2**31 - 1


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a Llama-style decoder: everything the KV and weight sizes depend on."""

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 131072
    #: Mixtral-style MoE (``num_local_experts``): every layer holds this many MLPs of ``intermediate_size``
    num_experts: int = 1
    #: ``rope_scaling.factor`` where it stretches ``max_position_embeddings`` (``max_seq_len``)
    rope_factor: float = 1.0
    #: the config's ``quantization_config`` in words ("awq 4-bit"), "" when none
    quantization: str = ""
    #: its model (``kv_weights``): the projections' bytes per weight; None (not modelled, or none): the plan's dtype
    weight_quant: WeightQuant | None = None
    #: what of the config is not planned, in words ("" when nothing): kv-plan warns with it
    unmodeled: str = ""

    def __post_init__(self) -> None:
        for key in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size",
                    "vocab_size", "max_position_embeddings", "num_experts"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InputError(f"model {self.name}: {key} must be a positive integer, got {value!r}")
            if value > MAX_DIM:  # 10**400 overflowed the float sizes (exit 3), 10**20 heads hung the --tp search
                raise InputError(f"model {self.name}: {key} {value} is above {MAX_DIM} (int32, what engines size a "
                                 "dimension with); fix config.json")
        factor = self.rope_factor
        if not isinstance(factor, int | float) or isinstance(factor, bool) or not 0 < factor < math.inf:
            raise InputError(f"model {self.name}: rope_scaling factor must be a positive number, got {factor!r}")
        if self.max_position_embeddings * factor > MAX_DIM:  # a factor of 1e308 made the context infinite (exit 3)
            raise InputError(f"model {self.name}: rope_scaling factor {factor!r} x max_position_embeddings "
                             f"{self.max_position_embeddings} is a context above {MAX_DIM} tokens (int32); fix "
                             "config.json")
        if self.max_seq_len < 1:  # a factor below 1/max_position_embeddings: kv-plan divided by the 0-token context
            raise InputError(f"model {self.name}: rope_scaling factor {factor!r} x max_position_embeddings "
                             f"{self.max_position_embeddings} leaves a context of 0 tokens; a factor stretches the "
                             "context (>= 1 in HF configs): fix config.json")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"model {self.name}: num_attention_heads {self.num_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_kv_heads}; fix config.json")

    @property
    def max_seq_len(self) -> int:
        """Tokens one request may hold: ``max_position_embeddings`` times the rope factor, as TensorRT-LLM sets its
        default ``max_seq_len`` (``builder._init_max_seq_len``)."""
        return int(self.max_position_embeddings * self.rope_factor)

    @property
    def num_params(self) -> int:
        """Parameter count of the decoder (embedding, attention, gated MLP, RMS norms, LM head)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2  # q, o + k, v
        mlp = 3 * h * self.intermediate_size * self.num_experts  # gate, up, down of each expert
        mlp += h * self.num_experts if self.num_experts > 1 else 0  # the router
        per_layer = attn + mlp + 2 * h  # two RMSNorm weights
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.num_layers * per_layer + embed + head + h

    @property
    def projection_params(self) -> int:
        """Parameters of the attention and MLP projections (what weight quantization shrinks)."""
        return projection_params(self.num_layers, self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                                 self.intermediate_size, self.num_experts)

    def weights_bytes(self, dtype: str, tp: int = 1) -> float:
        """Weights per GPU: the projections quantized per ``weight_quant``, everything else in ``dtype``."""
        return weights_bytes(self.num_params, self.projection_params, DTYPE_BYTES[dtype], self.weight_quant, tp)

    def kv_bytes_per_token(self, kv_dtype: str, tp: int = 1) -> int:
        """K and V for one token, all layers, on one GPU of a ``tp``-way tensor-parallel group."""
        heads = math.ceil(self.num_kv_heads / tp)
        return int(2 * self.num_layers * heads * self.head_dim * DTYPE_BYTES[kv_dtype])

    @classmethod
    def from_hf_config(cls, path: str | Path) -> ModelSpec:
        """Read an HF ``config.json`` (Llama/Mistral/Qwen-style field names)."""
        p = Path(path)
        try:
            cfg = json.loads(p.read_text(encoding="utf-8-sig"), object_pairs_hook=unique_keys)  # a BOM skipped
        except FileNotFoundError as exc:
            raise InputError(f"{p}: no such file; give a config.json or a preset ({', '.join(PRESETS)})") from exc
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{p}: not a readable JSON config ({exc}); give an HF config.json") from exc
        except (ValueError, RecursionError) as exc:  # json reads no integer of more than 4300 digits
            raise InputError(f"{p}: not a readable JSON config ({unreadable(exc)}); give an HF config.json") from exc
        if not isinstance(cfg, dict):
            raise InputError(f"{p}: the top level must be a JSON object with the model's config keys")
        return cls.from_dict(cfg, name=p.stem if p.stem != "config" else p.parent.name or "model", source=str(p))

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], name: str = "model", source: str = "config") -> ModelSpec:
        def need(key: str) -> Any:
            if key not in cfg:
                raise InputError(f"{source}: missing key {key!r}; an HF decoder config.json has it")
            return cfg[key]

        cfg, source, unmodeled = decoder_config(cfg, source)
        _refuse_unmodeled(cfg, source)
        quant = WeightQuant.from_config(cfg.get("quantization_config"))
        heads = need("num_attention_heads")
        hidden = need("hidden_size")
        def given(key: str, default: Any) -> Any:  # absent or null: the default; 0 is refused, never defaulted
            return default if cfg.get(key) is None else cfg[key]

        if cfg.get("head_dim") is None:  # derived: name the key that cannot derive it ("head_dim ... got 0" did not)
            for key, value in (("num_attention_heads", heads), ("hidden_size", hidden)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise InputError(f"{source}: {key} must be a positive integer, got {value!r}")
            if hidden % heads:  # 4096 / 24 was planned as head_dim 170 (4080 of the 4096 features), without a word
                raise InputError(f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}, "
                                 "so head_dim cannot be derived; add the model's head_dim to the config")
        head_dim = given("head_dim", hidden // heads if isinstance(hidden, int) and isinstance(heads, int)
                         and heads > 0 else 0)
        name = str(cfg.get("_name_or_path") or name)
        try:
            return cls(name=name, num_layers=need("num_hidden_layers"),
                       num_heads=heads, num_kv_heads=given("num_key_value_heads", heads), head_dim=head_dim,
                       hidden_size=hidden, intermediate_size=need("intermediate_size"),
                       vocab_size=need("vocab_size"), tie_word_embeddings=tied(cfg),
                       # not int(): "4096", [4096] and Infinity are refused by __post_init__, not coerced
                       max_position_embeddings=given("max_position_embeddings", 131072),
                       num_experts=given("num_local_experts", 1), rope_factor=_rope_factor(cfg, source),
                       quantization=quant[0], weight_quant=quant[1],
                       unmodeled="; ".join(filter(None, (unmodeled, sliding_note(cfg), context_note(cfg)))))
        except InputError as exc:  # name the file once, and the config's key, not ours
            text = exc.message.removeprefix(f"model {name}: ").removeprefix(f"{source}: ")  # named once
            for ours, key in _HF_KEYS.items():
                text = text.replace(f"{ours} ", f"{key} ", 1) if text.startswith(ours + " ") else text
            raise InputError(f"{source}: {text}") from exc


#: rope types whose ``max_position_embeddings`` is already the stretched context (TensorRT-LLM multiplies the others')
_ROPE_PRESTRETCHED = ("su", "longrope", "llama3")


def _rope_factor(cfg: dict[str, Any], source: str) -> Any:
    """``rope_scaling.factor`` for the rope types that stretch the context (linear, dynamic, yarn, ...), else 1."""
    rope = cfg.get("rope_scaling")
    if rope is None:
        return 1.0
    if not isinstance(rope, dict):
        raise InputError(f"{source}: rope_scaling must be an object or null, got {rope!r}")
    if rope.get("type", rope.get("rope_type")) in _ROPE_PRESTRETCHED:
        return 1.0
    return rope.get("factor", 1.0)


#: ``ModelSpec`` field -> the HF config.json key it is read from, where they differ (errors name the file's key)
_HF_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads", "num_experts": "num_local_experts"}


def _refuse_unmodeled(cfg: dict[str, Any], source: str) -> None:
    """Refuse what the Llama-style formulas would size wrongly without a word: MLA (DeepSeek-V2/V3 cache one
    compressed latent of ``kv_lora_rank + qk_rope_head_dim`` per token and layer, not K and V per head) and MoE
    layouts other than Mixtral's (routed experts of ``moe_intermediate_size``, shared experts, dense first layers),
    whose weights are many times the dense estimate (DeepSeek-V3: 671 B parameters, not 39 B)."""
    if cfg.get("kv_lora_rank"):
        raise InputError(f"{source}: multi-head latent attention (kv_lora_rank {cfg['kv_lora_rank']}) is not "
                         "modeled: kv-plan sizes K and V per KV head; plan an MLA model (DeepSeek-V2/V3) with "
                         "its serving engine's own estimator")
    for key in ("n_routed_experts", "num_experts", "moe_intermediate_size"):
        if cfg.get(key) and cfg[key] != 1:
            raise InputError(f"{source}: {key} {cfg[key]!r}: this MoE layout is not modeled (only Mixtral-style "
                             "num_local_experts with intermediate_size per expert); its weights would be sized as a "
                             "dense model's, so the plan would overstate the KV cache")
    _refuse_hybrid(cfg, source)


#: ``layer_types`` entries planned as attention layers (sliding ones as full: a lower bound, module docstring)
_ATTENTION_LAYERS = {"full_attention", "attention", "sliding_attention", "chunked_attention"}
#: Keys of hybrid attention/state-space layouts (Jamba, Nemotron-H, Zamba, Falcon-H1): only some layers hold KV
_HYBRID_KEYS = ("hybrid_override_pattern", "attn_layer_period", "layers_block_type", "mamba_d_state", "ssm_state_size")


def _refuse_hybrid(cfg: dict[str, Any], source: str) -> None:
    """Refuse layouts in which some layers hold no K/V (linear attention, Mamba/SSM blocks): the formula gives
    every one of ``num_hidden_layers`` layers K and V (and attention and MLP weights), so it would overstate the
    bytes per token and understate the blocks, by the ratio of all layers to attention layers."""
    types = cfg.get("layer_types")
    if isinstance(types, list):
        other = sorted({str(t) for t in types} - _ATTENTION_LAYERS)
        if other:
            raise InputError(f"{source}: layer_types has {', '.join(other)} layers, which hold no K/V per token: "
                             "this hybrid layout is not modeled (every layer would be sized as attention); plan it "
                             "with its serving engine's own estimator")
    for key in _HYBRID_KEYS:
        if cfg.get(key) is not None:
            raise InputError(f"{source}: {key} {cfg[key]!r}: a hybrid attention/state-space layout is not modeled "
                             "(only some layers hold K/V; every layer would be sized as attention); plan it with its "
                             "serving engine's own estimator")


#: Public architectures (from each model's HF config.json).
PRESETS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", 32, 32, 8, 128, 4096, 14336, 128256),
    "llama-3.1-70b": ModelSpec("llama-3.1-70b", 80, 64, 8, 128, 8192, 28672, 128256),
    "mistral-7b": ModelSpec("mistral-7b", 32, 32, 8, 128, 4096, 14336, 32768, max_position_embeddings=32768),
}


def load_model_spec(name_or_path: str) -> ModelSpec:
    """A preset name (case-insensitive) or a path to an HF config.json."""
    key = name_or_path.lower()
    if key in PRESETS:
        return PRESETS[key]
    p = Path(name_or_path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise InputError(f"{p}: a folder without config.json; give an HF config.json (or its folder) or a preset "
                             f"({', '.join(PRESETS)})")
        p = p / "config.json"
    if not p.exists() and not name_or_path.endswith(".json"):
        import difflib

        close = difflib.get_close_matches(key, list(PRESETS), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise InputError(f"unknown model {name_or_path!r}: {hint}give a config.json path or a preset "
                         f"({', '.join(PRESETS)})")
    return ModelSpec.from_hf_config(p)


@dataclass(frozen=True)
class KVPlan:
    """Pure data: the capacity plan. ``num_blocks`` is what the scheduler's block pool gets."""

    profile: str
    model: str
    tp: int
    weights_dtype: str
    kv_dtype: str
    #: how the projections' weights were sized: "" (in ``weights_dtype``) or the modelled quantization's label
    weights_quantization: str
    gpu_memory_bytes: int
    num_params: int
    weights_bytes: int  # per GPU
    activation_bytes: int
    reserve_bytes: int
    free_bytes: int
    memory_fraction: float
    kv_cache_bytes: int
    kv_bytes_per_token: int  # per GPU
    tokens_per_block: int
    bytes_per_block: int
    num_blocks: int
    max_tokens: int
    request_tokens: int
    max_seq_len: int
    blocks_per_request: int
    requests_that_fit: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _check_tp(spec: ModelSpec, tp: int) -> None:
    """Tensor parallelism splits the attention heads evenly (TensorRT-LLM, vLLM): ``tp`` must divide the query
    heads, and divide the KV heads or, past them, be a multiple of them (each KV head then replicated); else no
    engine shards the model that way and a plan would describe a deployment that cannot exist."""
    valid = valid_tps(spec)
    if tp not in valid:
        q, kv = spec.num_heads, spec.num_kv_heads
        raise InputError(f"--tp {tp}: model {spec.name} has {q} attention heads and {kv} KV heads "
                         f"(num_attention_heads, num_key_value_heads), which {tp} GPUs cannot split evenly; use "
                         f"--tp {' / '.join(map(str, valid))}")


def fp8_allowed(profile: Any) -> bool:
    """FP8 needs Ada/Hopper (compute capability >= 8.9) and a profile that allows it."""
    major, _, minor = str(profile.hardware.compute_capability).partition(".")
    return bool(profile.precision.allow_fp8) and (int(major), int(minor or 0)) >= (8, 9)


def plan_kv(profile: Any, model_spec: ModelSpec, *, tp: int = 1, kv_dtype: str | None = None,
            weights_dtype: str | None = None, request_tokens: int | None = None, max_num_tokens: int = 8192,
            max_batch: int = 256, memory_fraction: float | None = None,
            tokens_per_block: int | None = None) -> KVPlan:
    """Plan the KV cache of ``model_spec`` on ``profile`` (a ``trtforge.profiles.loader.Profile``).

    ``request_tokens``: prompt + output of one request, for ``requests_that_fit``; default 4096, or the model's
    ``max_seq_len`` if shorter. Raises InputError (exit 2) when the model does not fit, naming the sizes and what to
    change, and for a ``request_tokens`` beyond ``max_seq_len`` (no engine built for the model runs such a request).
    """
    if tp < 1:
        raise InputError(f"--tp must be >= 1, got {tp}")
    _check_tp(model_spec, tp)
    request_tokens = _request_tokens(model_spec, request_tokens)
    if not 1 <= max_num_tokens <= MAX_DIM:  # 10**400 overflowed the activation sizes' float (exit 3)
        raise InputError(f"--max-num-tokens must be from 1 to {MAX_DIM}, got {max_num_tokens}")
    wdt = weights_dtype or profile.precision.dtype
    kdt = kv_dtype or profile.precision.dtype
    for label, dt in (("weights dtype", wdt), ("--kv-dtype", kdt)):
        if dt not in DTYPE_BYTES:
            raise InputError(f"{label} {dt!r} unknown; use one of {', '.join(KV_DTYPES)}")
    if kdt in ("fp8", "float8") and not fp8_allowed(profile):
        raise InputError(f"--kv-dtype fp8: profile {profile.name!r} (compute capability "
                         f"{profile.hardware.compute_capability}) does not allow fp8; fp8 KV needs compute capability "
                         ">= 8.9 and allow_fp8 = true (e.g. --profile l40s), or use --kv-dtype int8")
    tpb = int(tokens_per_block or profile.kv.tokens_per_block)
    fraction = float(memory_fraction if memory_fraction is not None else profile.kv.memory_fraction)
    if not 0 < fraction <= 1:
        raise InputError(f"kv memory fraction must be in (0, 1], got {fraction}")
    if not math.isfinite(profile.hardware.memory_gb * GIB):  # 1e300 GiB: int() of the infinite bytes (exit 3)
        raise InputError(f"profile {profile.name}: hardware.memory_gb {profile.hardware.memory_gb:g} is beyond a "
                         "float's range in bytes; give the GPU's memory in GiB (80.0 for an H100)")
    gpu = int(profile.hardware.memory_gb * GIB)
    params = model_spec.num_params
    weights = int(model_spec.weights_bytes(wdt, tp))
    act = activation_bytes(model_spec, DTYPE_BYTES[wdt], max_num_tokens, max_batch, tp)
    free = gpu - weights - act - RUNTIME_RESERVE_BYTES
    per_token = model_spec.kv_bytes_per_token(kdt, tp)
    block_bytes = per_token * tpb
    kv_bytes = int(max(free, 0) * fraction)
    num_blocks = kv_bytes // block_bytes
    if free <= 0 or num_blocks < 1:
        raise no_fit(profile, model_spec, tp, (wdt, kdt), (request_tokens, max_num_tokens, max_batch, tpb), fraction,
                     (weights, act))
    per_req = math.ceil(request_tokens / tpb)
    return KVPlan(profile=profile.name, model=model_spec.name, tp=tp, weights_dtype=wdt, kv_dtype=kdt,
                  weights_quantization=model_spec.weight_quant.label if model_spec.weight_quant else "",
                  gpu_memory_bytes=gpu, num_params=params, weights_bytes=weights, activation_bytes=act,
                  reserve_bytes=RUNTIME_RESERVE_BYTES, free_bytes=free, memory_fraction=fraction,
                  kv_cache_bytes=kv_bytes, kv_bytes_per_token=per_token, tokens_per_block=tpb,
                  bytes_per_block=block_bytes, num_blocks=int(num_blocks), max_tokens=int(num_blocks) * tpb,
                  request_tokens=request_tokens, max_seq_len=model_spec.max_seq_len, blocks_per_request=per_req,
                  requests_that_fit=int(num_blocks) // per_req)


def _request_tokens(spec: ModelSpec, given: int | None) -> int:
    if given is None:
        return min(4096, spec.max_seq_len)
    if given < 1:
        raise InputError(f"--request-tokens must be >= 1, got {given}")
    if given > spec.max_seq_len:
        rope = f" x rope factor {spec.rope_factor:g}" if spec.rope_factor != 1 else ""
        raise InputError(f"--request-tokens {given}: model {spec.name} runs at most {spec.max_seq_len} tokens per "
                         f"request (max_position_embeddings {spec.max_position_embeddings}{rope}, TensorRT-LLM's "
                         f"max_seq_len); use --request-tokens <= {spec.max_seq_len}")
    return given
