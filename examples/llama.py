"""A small distilled Llama-style decoder as ONNX, shaped like what torch exporters hand to trtforge.

``make_llama(config, variant, seed)`` builds the model with ``onnx.helper`` only (no torch, nothing downloaded) and
deterministic weights from a NumPy seed. Architecture (HF ``LlamaForCausalLM``, no KV cache):

- token embedding -> ``layers`` x [RMSNorm -> grouped-query attention with rotary embeddings and a causal mask ->
  residual -> RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> ``lm_head``;
- graph input ``input_ids`` int64 [batch, sequence], output ``logits`` float32 [batch, sequence, vocab];
- projections are MatMul nodes ``/model/layers.{i}/self_attn/q_proj/MatMul`` (k/v/o_proj, ``mlp/gate_proj``,
  ``up_proj``, ``down_proj``) with [in, out] weights ``model.layers.{i}.self_attn.q_proj.weight`` etc.;
- positions come from ``Shape(input_ids) -> Gather -> Range`` and the causal mask from comparing positions, as
  exporters emit them, so batch and sequence stay dynamic.

Variants: ``"fp32"``, and ``"fp16-autocast"`` (fp16 weights and matmuls; RMSNorm, rotary tables and softmax in
fp32 behind Casts, as ``torch.autocast``/``model.half()`` exports look; logits cast back to float32). Both carry the
removable fragments real exporters leave, on purpose, so that the fold pass has work to do: Casts to the tensor's own
type, Identity on initializers, duplicate sibling Casts (each layer casts the shared cos/sin tables), Casts of
Constants, ``Shape(Cast(x))``, and an exact fp16->fp32->fp16 round trip, next to the Cast boundaries around norms
and softmax that are genuinely needed in the fp16 variant.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import onnx
from onnx import helper

from ._graph import FLOAT, FLOAT16, INT32, INT64, GraphWriter, np_dtype

__all__ = ["BIGGER", "VARIANTS", "LlamaConfig", "hf_config", "llama_weights", "make_llama", "PROJECTIONS"]

Variant = Literal["fp32", "fp16-autocast"]
VARIANTS: tuple[str, ...] = ("fp32", "fp16-autocast")
OPSET = 18
# (scope under /model/layers.{i}/, weight suffix) for every projection MatMul.
PROJECTIONS: tuple[tuple[str, str], ...] = (
    ("self_attn/q_proj", "self_attn.q_proj"), ("self_attn/k_proj", "self_attn.k_proj"),
    ("self_attn/v_proj", "self_attn.v_proj"), ("self_attn/o_proj", "self_attn.o_proj"),
    ("mlp/gate_proj", "mlp.gate_proj"), ("mlp/up_proj", "mlp.up_proj"), ("mlp/down_proj", "mlp.down_proj"),
)


@dataclass(frozen=True)
class LlamaConfig:
    """Model shape. ``heads`` must be a multiple of ``kv_heads`` (grouped-query attention); ``head_dim`` even."""

    layers: int = 2
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 688
    vocab: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            if getattr(self, field) < 1:
                raise ValueError(f"LlamaConfig.{field} must be >= 1, got {getattr(self, field)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"LlamaConfig.heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")


# The benchmark model: same code, four layers at hidden 512.
BIGGER = LlamaConfig(layers=4, hidden=512, heads=8, kv_heads=2, head_dim=64, intermediate=1376, vocab=4096)


def llama_weights(config: LlamaConfig = LlamaConfig(), seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic float32 weights by HF name; projections are [in, out]. Small scale keeps fp16 finite."""
    rng = np.random.default_rng(seed)
    c = config

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def norm_weight() -> np.ndarray:
        # Distilled models' norm gains are not all ones; keep them near one.
        return (1.0 + 0.1 * rng.standard_normal(c.hidden)).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(c.vocab, c.hidden)}
    q_out, kv_out = c.heads * c.head_dim, c.kv_heads * c.head_dim
    for i in range(c.layers):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = norm_weight()
        w[f"{p}.self_attn.q_proj.weight"] = normal(c.hidden, q_out)
        w[f"{p}.self_attn.k_proj.weight"] = normal(c.hidden, kv_out)
        w[f"{p}.self_attn.v_proj.weight"] = normal(c.hidden, kv_out)
        w[f"{p}.self_attn.o_proj.weight"] = normal(q_out, c.hidden)
        w[f"{p}.post_attention_layernorm.weight"] = norm_weight()
        w[f"{p}.mlp.gate_proj.weight"] = normal(c.hidden, c.intermediate)
        w[f"{p}.mlp.up_proj.weight"] = normal(c.hidden, c.intermediate)
        w[f"{p}.mlp.down_proj.weight"] = normal(c.intermediate, c.hidden)
    w["model.norm.weight"] = norm_weight()
    w["lm_head.weight"] = normal(c.hidden, c.vocab)
    return w


def inv_freq(config: LlamaConfig) -> np.ndarray:
    """Rotary inverse frequencies, ``theta ** (-2j / head_dim)`` (HF's default rope)."""
    exponent = np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim
    return (1.0 / (config.rope_theta ** exponent)).astype(np.float32)


class _Builder:
    """Emits the decoder into a GraphWriter. ``dt`` is the model dtype (FLOAT or FLOAT16)."""

    def __init__(self, config: LlamaConfig, dt: int) -> None:
        self.c, self.dt, self.g = config, dt, GraphWriter()

    def rms_norm(self, x: str, scope: str, weight: str, identity: bool) -> str:
        """HF LlamaRMSNorm: computed in fp32 (Cast in, Cast out), then ``weight * x.to(dtype)``."""
        g = self.g
        xf = g.cast(x, FLOAT, f"{scope}/Cast")  # same-type Cast in the fp32 variant, needed in fp16
        sq = g.op("Pow", [xf, g.const(np.array(2.0, np.float32), f"{scope}/Constant")], f"{scope}/Pow")
        var = g.op("ReduceMean", [sq, g.const_i64([-1], f"{scope}/Constant_1")], f"{scope}/ReduceMean", keepdims=1)
        # Cast of a Constant: eps arrives as a double literal.
        eps = g.cast(g.const(np.array(self.c.rms_norm_eps, np.float64), f"{scope}/Constant_2"), FLOAT,
                     f"{scope}/Cast_1")
        rs = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [var, eps], f"{scope}/Add")], f"{scope}/Sqrt")],
                  f"{scope}/Reciprocal")
        xn = g.cast(g.op("Mul", [xf, rs], f"{scope}/Mul"), self.dt, f"{scope}/Cast_2")
        w = g.op("Identity", [weight], f"{scope}/Identity") if identity else weight
        return g.op("Mul", [w, xn], f"{scope}/Mul_1")

    def rope(self, t: str, cos: str, sin: str, scope: str) -> str:
        """``t * cos + rotate_half(t) * sin`` with rotate_half(t) = concat(-t2, t1)."""
        g, half = self.g, self.c.head_dim // 2
        axes = g.const_i64([-1], f"{scope}/Constant")
        t1 = g.op("Slice", [t, g.const_i64([0], f"{scope}/Constant_1"), g.const_i64([half], f"{scope}/Constant_2"),
                            axes], f"{scope}/Slice")
        t2 = g.op("Slice", [t, g.const_i64([half], f"{scope}/Constant_3"),
                            g.const_i64([self.c.head_dim], f"{scope}/Constant_4"), axes], f"{scope}/Slice_1")
        rot = g.op("Concat", [g.op("Neg", [t2], f"{scope}/Neg"), t1], f"{scope}/Concat", axis=-1)
        return g.op("Add", [g.op("Mul", [t, cos], f"{scope}/Mul"), g.op("Mul", [rot, sin], f"{scope}/Mul_1")],
                    f"{scope}/Add")

    def heads(self, x: str, n: int, scope: str) -> str:
        """[B, S, n*D] -> [B, n, S, D]."""
        g = self.g
        r = g.op("Reshape", [x, g.const_i64([0, 0, n, self.c.head_dim], f"{scope}/Constant")], f"{scope}/Reshape")
        return g.op("Transpose", [r], f"{scope}/Transpose", perm=[0, 2, 1, 3])

    def repeat_kv(self, t: str, scope: str) -> str:
        """[B, kvH, S, D] -> [B, H, S, D] via Unsqueeze -> Expand -> Reshape (HF repeat_kv)."""
        g, c = self.g, self.c
        n_rep = c.heads // c.kv_heads
        if n_rep == 1:
            return t
        u = g.op("Unsqueeze", [t, g.const_i64([2], f"{scope}/Constant")], f"{scope}/Unsqueeze")
        e = g.op("Expand", [u, g.const_i64([1, 1, n_rep, 1, 1], f"{scope}/Constant_1")], f"{scope}/Expand")
        return g.op("Reshape", [e, g.const_i64([0, c.heads, -1, c.head_dim], f"{scope}/Constant_2")],
                    f"{scope}/Reshape")

    def attention(self, x: str, i: int, cos: str, sin: str, mask: str) -> str:
        g, c, dt = self.g, self.c, self.dt
        s, wp = f"/model/layers.{i}/self_attn", f"model.layers.{i}.self_attn"
        q = g.op("MatMul", [x, f"{wp}.q_proj.weight"], f"{s}/q_proj/MatMul")
        k = g.op("MatMul", [x, f"{wp}.k_proj.weight"], f"{s}/k_proj/MatMul")
        v = g.op("MatMul", [x, f"{wp}.v_proj.weight"], f"{s}/v_proj/MatMul")
        q, k, v = (self.heads(q, c.heads, f"{s}/q"), self.heads(k, c.kv_heads, f"{s}/k"),
                   self.heads(v, c.kv_heads, f"{s}/v"))
        # Every layer casts the shared fp32 cos/sin tables itself: duplicate sibling Casts across layers.
        cos_l, sin_l = g.cast(cos, dt, f"{s}/Cast"), g.cast(sin, dt, f"{s}/Cast_1")
        q, k = self.rope(q, cos_l, sin_l, f"{s}/rotary_q"), self.rope(k, cos_l, sin_l, f"{s}/rotary_k")
        k, v = self.repeat_kv(k, f"{s}/repeat_k"), self.repeat_kv(v, f"{s}/repeat_v")
        kt = g.op("Transpose", [k], f"{s}/Transpose", perm=[0, 1, 3, 2])
        scores = g.op("MatMul", [q, kt], f"{s}/MatMul")
        # Cast of a Constant: the 1/sqrt(head_dim) scale is an fp32 literal cast to the model dtype.
        scale = g.cast(g.const(np.array(1.0 / math.sqrt(c.head_dim), np.float32), f"{s}/Constant"), dt,
                       f"{s}/Cast_2")
        scores = g.op("Mul", [scores, scale], f"{s}/Mul")
        # softmax(dtype=float32).to(dtype): needed Cast boundary in fp16, same-type Casts in fp32.
        sf = g.op("Add", [g.cast(scores, FLOAT, f"{s}/Cast_3"), mask], f"{s}/Add")
        probs = g.cast(g.op("Softmax", [sf], f"{s}/Softmax", axis=-1), dt, f"{s}/Cast_4")
        ctx = g.op("Transpose", [g.op("MatMul", [probs, v], f"{s}/MatMul_1")], f"{s}/Transpose_1", perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, g.const_i64([0, 0, c.heads * c.head_dim], f"{s}/Constant_1")], f"{s}/Reshape")
        return g.op("MatMul", [ctx, f"{wp}.o_proj.weight"], f"{s}/o_proj/MatMul")

    def mlp(self, x: str, i: int) -> str:
        g = self.g
        s, wp = f"/model/layers.{i}/mlp", f"model.layers.{i}.mlp"
        gate = g.op("MatMul", [x, f"{wp}.gate_proj.weight"], f"{s}/gate_proj/MatMul")
        act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{s}/act_fn/Sigmoid")], f"{s}/act_fn/Mul")
        up = g.op("MatMul", [x, f"{wp}.up_proj.weight"], f"{s}/up_proj/MatMul")
        return g.op("MatMul", [g.op("Mul", [act, up], f"{s}/Mul"), f"{wp}.down_proj.weight"],
                    f"{s}/down_proj/MatMul")

    def build(self, weights: dict[str, np.ndarray]) -> onnx.GraphProto:
        g, c, dt = self.g, self.c, self.dt
        for name, arr in weights.items():
            g.initializer(arr.astype(np_dtype(dt)), name)
        g.initializer(inv_freq(c), "model.rotary_emb.inv_freq")  # fp32 in both variants, like HF's buffer

        ids = g.cast("input_ids", INT64, "/model/Cast")  # same-type Cast (exporters' .long())
        # Shape(Cast(x)): the sequence length is read through an int32 Cast that only Shape consumes.
        shape = g.op("Shape", [g.cast("input_ids", INT32, "/model/Cast_1")], "/model/Shape")
        seq = g.op("Gather", [shape, g.const(np.array(1, np.int64), "/model/Constant")], "/model/Gather", axis=0)
        positions = g.op("Range", [g.const(np.array(0, np.int64), "/model/Constant_1"), seq,
                                   g.const(np.array(1, np.int64), "/model/Constant_2")], "/model/Range")

        # Rotary tables in fp32: [S, head_dim].
        r = "/model/rotary_emb"
        pos = g.op("Unsqueeze", [g.cast(positions, FLOAT, f"{r}/Cast"), g.const_i64([1], f"{r}/Constant")],
                   f"{r}/Unsqueeze")
        inv = g.op("Unsqueeze", ["model.rotary_emb.inv_freq", g.const_i64([0], f"{r}/Constant_1")],
                   f"{r}/Unsqueeze_1")
        freqs = g.op("Mul", [pos, inv], f"{r}/Mul")
        emb = g.op("Concat", [freqs, freqs], f"{r}/Concat", axis=-1)
        cos, sin = g.op("Cos", [emb], f"{r}/Cos"), g.op("Sin", [emb], f"{r}/Sin")

        # Causal mask [S, S] (fp32, added to fp32 scores): key position > query position -> large negative.
        m = "/model/causal_mask"
        rows = g.op("Unsqueeze", [positions, g.const_i64([1], f"{m}/Constant")], f"{m}/Unsqueeze")
        cols = g.op("Unsqueeze", [positions, g.const_i64([0], f"{m}/Constant_1")], f"{m}/Unsqueeze_1")
        future = g.op("Greater", [cols, rows], f"{m}/Greater")
        # -1e4 is exact in fp16/bf16 and far below any score, so exp() underflows to 0 in every precision.
        neg = g.cast(g.const(np.array(-1e4, np.float64), f"{m}/Constant_2"), FLOAT, f"{m}/Cast")
        zero = g.const(np.array(0.0, np.float32), f"{m}/Constant_3")
        mask = g.op("Where", [future, neg, zero], f"{m}/Where")

        h = g.op("Gather", ["model.embed_tokens.weight", ids], "/model/embed_tokens/Gather", axis=0)
        # An exact round trip (model dtype -> fp32 -> model dtype), as `.float()` then `.to(dtype)` exports it.
        h = g.cast(g.cast(h, FLOAT, "/model/Cast_2"), dt, "/model/Cast_3")
        for i in range(c.layers):
            p, wp = f"/model/layers.{i}", f"model.layers.{i}"
            x = self.rms_norm(h, f"{p}/input_layernorm", f"{wp}.input_layernorm.weight", identity=True)
            h = g.op("Add", [h, self.attention(x, i, cos, sin, mask)], f"{p}/Add")
            x = self.rms_norm(h, f"{p}/post_attention_layernorm", f"{wp}.post_attention_layernorm.weight",
                              identity=False)
            h = g.op("Add", [h, self.mlp(x, i)], f"{p}/Add_1")
        h = self.rms_norm(h, "/model/norm", "model.norm.weight", identity=False)
        lm = g.op("Identity", ["lm_head.weight"], "/lm_head/Identity")  # tied-weight exports look like this
        logits = g.op("MatMul", [h, lm], "/lm_head/MatMul")
        g.nodes.append(helper.make_node("Cast", [logits], ["logits"], name="/Cast", to=FLOAT))

        inputs = [helper.make_tensor_value_info("input_ids", INT64, ["batch", "sequence"])]
        outputs = [helper.make_tensor_value_info("logits", FLOAT, ["batch", "sequence", c.vocab])]
        return helper.make_graph(g.nodes, "llama", inputs, outputs, initializer=g.initializers)


def make_llama(config: LlamaConfig = LlamaConfig(), variant: Variant = "fp32", seed: int = 0) -> onnx.ModelProto:
    """The example decoder as an ONNX model (opset 18); same ``seed`` -> same weights in both variants."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    dt = FLOAT if variant == "fp32" else FLOAT16
    graph = _Builder(config, dt).build(llama_weights(config, seed))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="trtforge",
                              producer_version="example", doc_string=f"trtforge example Llama ({variant})")
    # IR 8 is what opset 18 shipped with; older readers (TensorRT's parser) accept it.
    model.ir_version = 8
    helper.set_model_props(model, {"trtforge.variant": variant, "trtforge.seed": str(seed),
                                   "trtforge.config": json.dumps(asdict(config))})
    return model


def hf_config(config: LlamaConfig = LlamaConfig(), torch_dtype: str = "float16") -> dict[str, object]:
    """An HF ``config.json`` for the model (what ``trtforge kv-plan --model`` reads)."""
    c = config
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": c.layers,
        "hidden_size": c.hidden,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate,
        "vocab_size": c.vocab,
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": torch_dtype,
    }
