"""Small transformer models in plain torch for the fold benchmark (no downloads), exported at bench time.

DistilBERT-like (post-norm encoder, GELU FFN, no token types), MiniLM-like (BERT encoder with token types and a
tanh pooler), Llama-like decoder (RMSNorm computed in fp32 and cast back, rotary embeddings, GQA, causal mask,
SwiGLU MLP, softmax in fp32): the patterns whose exports carry Casts and Identities.
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass

import onnx
import torch
from torch import nn


@dataclass(frozen=True)
class EncCfg:
    vocab: int = 1000
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    inter: int = 256
    max_pos: int = 64
    type_vocab: int = 0  # > 0: BERT token types
    pooler: bool = False


class _SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int | None = None, bias: bool = True) -> None:
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads or heads
        self.dim = hidden // heads
        self.q = nn.Linear(hidden, heads * self.dim, bias=bias)
        self.k = nn.Linear(hidden, self.kv_heads * self.dim, bias=bias)
        self.v = nn.Linear(hidden, self.kv_heads * self.dim, bias=bias)
        self.o = nn.Linear(heads * self.dim, hidden, bias=bias)

    def split(self, t: torch.Tensor, heads: int) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, heads, self.dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                fp32_softmax: bool = False) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.split(self.q(x), self.heads), self.split(self.k(x), self.kv_heads), self.split(self.v(x),
                                                                                                    self.kv_heads)
        if rope is not None:
            cos, sin = rope
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.dim) + mask
        if fp32_softmax:
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        else:
            probs = torch.softmax(scores, dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(b, s, self.heads * self.dim)
        return self.o(out)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _EncoderLayer(nn.Module):
    def __init__(self, c: EncCfg) -> None:
        super().__init__()
        self.attn = _SelfAttention(c.hidden, c.heads)
        self.ln1, self.ln2 = nn.LayerNorm(c.hidden), nn.LayerNorm(c.hidden)
        self.ff1, self.ff2 = nn.Linear(c.hidden, c.inter), nn.Linear(c.inter, c.hidden)
        self.drop = nn.Dropout(0.1)  # eval: exported as Identity by some exporters

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(h + self.drop(self.attn(h, mask)))
        return self.ln2(h + self.drop(self.ff2(nn.functional.gelu(self.ff1(h)))))


class Encoder(nn.Module):
    def __init__(self, c: EncCfg) -> None:
        super().__init__()
        self.c = c
        self.word = nn.Embedding(c.vocab, c.hidden)
        self.pos = nn.Embedding(c.max_pos, c.hidden)
        self.types = nn.Embedding(c.type_vocab, c.hidden) if c.type_vocab else None
        self.ln = nn.LayerNorm(c.hidden)
        self.layers = nn.ModuleList(_EncoderLayer(c) for _ in range(c.layers))
        self.pool = nn.Linear(c.hidden, c.hidden) if c.pooler else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device).unsqueeze(0)
        h = self.word(input_ids) + self.pos(pos)
        if self.types is not None:
            h = h + self.types(torch.zeros_like(input_ids))
        h = self.ln(h)
        ext = attention_mask[:, None, None, :].to(h.dtype)
        ext = (1.0 - ext) * torch.finfo(h.dtype).min
        for layer in self.layers:
            h = layer(h, ext)
        if self.pool is not None:
            return h, torch.tanh(self.pool(h[:, 0]))
        return h


@dataclass(frozen=True)
class DecCfg:
    vocab: int = 1000
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    inter: int = 344
    theta: float = 10000.0


class _RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class _DecoderLayer(nn.Module):
    def __init__(self, c: DecCfg) -> None:
        super().__init__()
        self.n1, self.n2 = _RMSNorm(c.hidden), _RMSNorm(c.hidden)
        self.attn = _SelfAttention(c.hidden, c.heads, c.kv_heads, bias=False)
        self.gate = nn.Linear(c.hidden, c.inter, bias=False)
        self.up = nn.Linear(c.hidden, c.inter, bias=False)
        self.down = nn.Linear(c.inter, c.hidden, bias=False)

    def forward(self, h, mask, rope):
        h = h + self.attn(self.n1(h), mask, rope, fp32_softmax=True)
        x = self.n2(h)
        return h + self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class Decoder(nn.Module):
    def __init__(self, c: DecCfg) -> None:
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(_DecoderLayer(c) for _ in range(c.layers))
        self.norm = _RMSNorm(c.hidden)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        dim = c.hidden // c.heads
        self.register_buffer("inv_freq", 1.0 / (c.theta ** (torch.arange(0, dim, 2).float() / dim)), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        h = self.embed(input_ids)
        pos = torch.arange(s, device=input_ids.device).float()
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        rope = (emb.cos().to(h.dtype)[None, None], emb.sin().to(h.dtype)[None, None])
        mask = torch.full((s, s), torch.finfo(h.dtype).min, dtype=h.dtype).triu(1)[None, None]
        for layer in self.layers:
            h = layer(h, mask, rope)
        return self.lm_head(self.norm(h)).float()


MODELS = {
    "distilbert": lambda: Encoder(EncCfg()),
    "minilm": lambda: Encoder(EncCfg(hidden=96, layers=3, heads=4, inter=384, type_vocab=2, pooler=True)),
    "llama": lambda: Decoder(DecCfg()),
}


def _inputs(name: str) -> tuple[tuple[torch.Tensor, ...], list[str], dict]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (2, 8), generator=g)
    if name == "llama":
        return (ids,), ["input_ids"], {"input_ids": {0: "batch", 1: "sequence"}}
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    return (ids, mask), ["input_ids", "attention_mask"], axes


def export(name: str, precision: str, exporter: str) -> onnx.ModelProto:
    """precision: fp32 | fp16 | fp16-autocast; exporter: dynamo | dynamo-optimize | torchscript."""
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    if precision == "fp16":
        model = model.half()
    args, names, axes = _inputs(name)
    buf = io.BytesIO()
    ctx = torch.autocast("cpu", dtype=torch.float16) if precision == "fp16-autocast" else _null()
    with warnings.catch_warnings(), torch.no_grad(), ctx:
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, args, buf, dynamo=False, input_names=names, dynamic_axes=axes, opset_version=18)
            return onnx.load_from_string(buf.getvalue())
        dyn = {k: {i: torch.export.Dim.DYNAMIC for i in v} for k, v in axes.items()}
        prog = torch.onnx.export(model, args, dynamo=True, optimize=exporter == "dynamo-optimize",
                                 input_names=names, dynamic_shapes=dyn, verbose=False)
        return prog.model_proto


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None
