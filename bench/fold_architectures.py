"""Six small architectures outside ``fold_models.py``'s corpus, each exported three ways, folded by trtforge (with
``--check``), onnxslim and onnx-simplifier: Cast+CastLike+Identity left per tool, and trtforge's exactness under
onnx.reference and under onnxruntime with optimizations off.

T5 relative-position buckets (float log -> int cast), GPT-2 causal and padding masks (``finfo.min``), an fp16
RMSNorm with fp32 islands and round trips, int32 ids with cumsum positions and argmax/gather, ALiBi slopes, a conv
stem with LayerNorm. Run: ``python -P bench/fold_architectures.py`` (needs the ``bench`` extra; about 1 minute).
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

_F = torch.nn.functional


class T5Bucket(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lin = nn.Embedding(32, 4), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = torch.arange(x.shape[1])[:, None] - torch.arange(x.shape[1])[None, :]
        ret = (n < 0).to(torch.long) * 16
        n = torch.abs(n)
        large = 8 + (torch.log(n.float() / 8 + 1e-6) / math.log(16) * 8).to(torch.long)
        b = ret + torch.where(n < 8, n, torch.min(large, torch.full_like(large, 15)))
        h = self.lin(x)
        return torch.softmax(h @ h.transpose(1, 2) + self.emb(b).permute(2, 0, 1).sum(0), -1) @ h


class GPT2Mask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.o = nn.Linear(16, 48), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        causal = torch.tril(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool))
        sc = ((q @ k.transpose(1, 2)) / 4.0).masked_fill(~causal, torch.finfo(torch.float32).min)
        m = (1.0 - attn_mask[:, None, :].to(sc.dtype)) * torch.finfo(torch.float32).min
        return self.o(torch.softmax(sc + m, -1) @ v)


class HalfRMS(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w, self.lin = nn.Parameter(torch.rand(16)), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x.half()
        var = h.float().pow(2).mean(-1, keepdim=True)
        h = (h.float() * torch.rsqrt(var + 1e-6)).half() * self.w.half()
        y = self.lin(h.float()).half()
        return y.float().to(torch.float64).to(torch.float32), h.to(torch.int32)


class IdsPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lin = nn.Embedding(50, 16), nn.Linear(16, 50)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pos = (torch.cumsum(mask.to(torch.int32), 1) * mask.to(torch.int32)).to(torch.long)
        logits = self.lin(self.emb(ids.to(torch.long)) + self.emb(pos % 50))
        top = logits.argmax(-1).to(torch.int32)
        g = torch.gather(logits, -1, top.to(torch.long).unsqueeze(-1))
        return top.to(torch.int64), g.to(torch.float64).to(torch.float32), logits.to(torch.bfloat16).to(torch.float32)


class Alibi(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        slopes = torch.tensor([2 ** (-8 * (i + 1) / 4) for i in range(4)])
        pos = torch.arange(n, dtype=torch.int32).to(torch.float32)
        bias = slopes[:, None, None] * (pos[None, None, :] - pos[None, :, None])
        h = self.lin(x).view(x.shape[0], n, 4, 4).transpose(1, 2)
        a = torch.softmax(h @ h.transpose(-1, -2) + bias, -1)
        return (a @ h).transpose(1, 2).reshape(x.shape[0], n, 16).to(torch.float16).to(torch.float32)


class ConvStem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.ln = nn.Conv1d(8, 16, 3, padding=1), nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.ln(_F.gelu(self.c(x.to(torch.float32))).transpose(1, 2).to(torch.float64).float())
        return h.to(torch.float16).to(torch.float32), (h > 0).to(torch.int8).to(torch.int32)


MODELS = (T5Bucket, GPT2Mask, HalfRMS, IdsPositions, Alibi, ConvStem)
EXPORTERS = ("torchscript", "dynamo", "dynamo-optimize")
_KEPT = ("Cast", "CastLike", "Identity")


def _args(cls: type) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    if cls is GPT2Mask:
        return torch.randn(2, 6, 16, generator=g), (torch.rand(2, 6, generator=g) > 0.3).to(torch.int64)
    if cls is IdsPositions:
        return (torch.randint(0, 50, (2, 7), generator=g, dtype=torch.int32),
                (torch.rand(2, 7, generator=g) > 0.2).to(torch.int64))
    return (torch.randn(2, 8, 10, generator=g),) if cls is ConvStem else (torch.randn(2, 6, 16, generator=g),)


def export(cls: type, exporter: str, path: Path) -> None:
    torch.manual_seed(0)
    model = cls().eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, _args(cls), str(path), dynamo=False, opset_version=17)
        else:
            torch.onnx.export(model, _args(cls), dynamo=True, optimize=exporter == "dynamo-optimize",
                              verbose=False).save(str(path))


def _left(model: onnx.ModelProto) -> int:
    return sum(n.op_type in _KEPT for n in model.graph.node)


def _feeds(model: onnx.ModelProto, cls: type) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    out = {}
    for vi, a in zip(model.graph.input, _args(cls), strict=False):
        arr = a.numpy()
        out[vi.name] = rng.standard_normal(arr.shape).astype(arr.dtype) if arr.dtype.kind == "f" else arr
    return out


def _same(a: list, b: list) -> bool:
    return all(x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b, strict=True))


def _exact(src: Path, folded: Path, feeds: dict[str, np.ndarray]) -> tuple[str, str]:
    """Bit-identical under onnx.reference, and under onnxruntime with optimizations off: yes / NO / n/a (that
    runtime cannot run the source model)."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runners = (lambda p: ReferenceEvaluator(str(p)).run(None, feeds),
               lambda p: ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]).run(None, feeds))
    out = []
    for run in runners:
        try:
            a = run(src)
        except Exception:  # noqa: BLE001 (the runtime's own limit, e.g. onnx.reference's GatherElements broadcast)
            out.append("n/a")
            continue
        out.append("yes" if _same(a, run(folded)) else "NO")
    return out[0], out[1]


def _others(model: onnx.ModelProto) -> tuple[int, int]:
    import onnxsim
    import onnxslim

    slim = onnxslim.slim(onnx.ModelProto.FromString(model.SerializeToString()))
    sim, _ = onnxsim.simplify(onnx.ModelProto.FromString(model.SerializeToString()))
    return _left(slim), _left(sim)


def row(cls: type, exporter: str, work: Path) -> str:
    src, folded = work / f"{cls.__name__}_{exporter}.onnx", work / f"{cls.__name__}_{exporter}.fold.onnx"
    export(cls, exporter, src)
    cli = [sys.executable, "-c", "from trtforge.build_engine.cli import main; raise SystemExit(main())"]
    rc = subprocess.run([*cli, "fold", str(src), "-o", str(folded), "--check"], capture_output=True).returncode
    model = onnx.load(str(src))
    ref, ort_same = _exact(src, folded, _feeds(model, cls)) if rc == 0 else ("-", "-")
    slim, sim = _others(model)
    return (f"| {cls.__name__} | {exporter} | {_left(model)} | {_left(onnx.load(str(folded))) if rc == 0 else '-'} | "
            f"{slim} | {sim} | {rc} | {ref} | {ort_same} |")


def main() -> int:
    print("| model | exporter | in export | trtforge | onnxslim | onnxsim | fold --check rc | "
          "exact (onnx.reference) | exact (onnxruntime, opt. off) |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for cls in MODELS:
            for exporter in EXPORTERS:
                print(row(cls, exporter, Path(tmp)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
