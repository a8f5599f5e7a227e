"""Roofline step-time model: how long one scheduler step takes on a profile's GPU.

One step runs one forward over every scheduled token (chunked prefill + one decode token per decoding request).
Its time is the larger of the memory time and the compute time, plus a fixed launch/scheduling overhead::

    bytes  = weights + KV read by attention (every scheduled token's context) + KV written
    flops  = 2 * matmul_params * tokens + 4 * layers * heads * head_dim * sum(attended context per token)
    t      = overhead + max(bytes / (bandwidth * bw_eff), flops / (tflops * flop_eff))

Decode is memory-bound (the weights are read once per step whatever the batch), prefill compute-bound. The
efficiency factors (``bw_eff`` 0.8: well-tuned kernels stream at about 80% of HBM peak; ``flop_eff`` 0.55: dense
GEMM plus attention at serving shapes; ``overhead_s`` 2 ms: CUDA-graph launch, sampling, Python scheduling in
TensorRT-LLM's PyTorch backend) are engineering estimates, not fitted.

Calibration (one point, reported, never fitted): NVIDIA TensorRT-LLM "Performance Overview"
(docs/source/performance/perf-overview.md, https://nvidia.github.io/TensorRT-LLM/performance/perf-overview.html,
v0.19-0.20 tables, ``trtllm-bench throughput``, PyTorch backend): Llama-3.1-8B-Instruct-FP8 on one H100 80GB
HBM3, ISL 1000 / OSL 1000, total output throughput 15,270.02 tokens/s. ``CALIBRATION`` holds it;
``calibrate`` replays that offline benchmark in the simulator with fp8 weights and KV and returns
model / published.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, Final

from ..kv_plan import ModelSpec

CALIBRATION: Final[Mapping[str, Any]] = MappingProxyType({
    "source": "NVIDIA TensorRT-LLM Performance Overview (perf-overview.md, v0.19/v0.20), trtllm-bench throughput",
    "model": "llama-3.1-8b", "weights": "fp8", "kv_dtype": "fp8", "gpu": "H100 80GB HBM3", "profile": "h100",
    "isl": 1000, "osl": 1000, "num_requests": 3000, "output_tok_s": 15270.02,
})


@dataclass(frozen=True)
class StepTimeModel:
    spec: ModelSpec
    bandwidth_gbs: float
    tflops: float
    weights_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = 1
    bw_eff: float = 0.8
    flop_eff: float = 0.55
    overhead_s: float = 0.002

    @classmethod
    def from_profile(cls, profile: Any, spec: ModelSpec, weights_dtype: str | None = None,
                     kv_dtype: str | None = None, tp: int = 1, **kw: float) -> StepTimeModel:
        wdt = weights_dtype or profile.precision.dtype
        hw = profile.hardware
        tflops = {"fp16": hw.fp16_tflops, "bf16": hw.bf16_tflops}.get(wdt)
        if wdt == "fp8":
            tflops = hw.fp8_tflops or hw.bf16_tflops
        return cls(spec, hw.memory_bandwidth_gbs, float(tflops or hw.fp16_tflops), wdt, kv_dtype or wdt, tp, **kw)

    # cached: ``step_seconds`` runs once per simulated step (10^5 times a replay) and the spec's counts are
    # computed properties
    @cached_property
    def weights_bytes(self) -> float:
        return self.spec.weights_bytes(self.weights_dtype, self.tp)  # a quantization_config's projections shrink

    @cached_property
    def matmul_params(self) -> int:
        """Parameters multiplied per token: all but the embedding table (the LM head runs per sampled token)."""
        return self.spec.num_params - 2 * self.spec.vocab_size * self.spec.hidden_size

    @cached_property
    def _consts(self) -> tuple[float, float, float, float, float, float]:
        """(kv bytes/token, weights bytes, bytes/s, flop/s, flops per token, flops per attended key), per tp."""
        s = self.spec
        return (float(s.kv_bytes_per_token(self.kv_dtype, self.tp)), self.weights_bytes,
                self.bandwidth_gbs * 1e9 * self.bw_eff, self.tflops * 1e12 * self.flop_eff,
                (2.0 * self.matmul_params + 2.0 * s.vocab_size * s.hidden_size) / self.tp,
                4.0 * s.num_layers * s.num_heads * s.head_dim / self.tp)

    def decode_seconds(self, decode_contexts_sum: int, num_decode: int) -> float:
        """``step_seconds([], decode_contexts_sum, num_decode)``, cheaper (the simulator's quiet decode steps)."""
        if num_decode == 0:
            return 0.0
        kv_tok, w, bw, fl, per_tok, per_key = self._consts
        t_mem = (w + kv_tok * (decode_contexts_sum + num_decode)) / bw
        t_flop = (per_tok * num_decode + per_key * decode_contexts_sum) / fl
        return self.overhead_s + (t_mem if t_mem > t_flop else t_flop)

    def step_seconds(self, context_chunks: list[tuple[int, int]], decode_contexts_sum: int, num_decode: int) -> float:
        """``context_chunks``: (first token index, tokens) per prefill chunk; decode requests: their count and
        the sum of their context lengths."""
        s = self.spec
        kv_tok = self._consts[0]
        prefill_tokens = 0
        attended = decode_contexts_sum  # one query token per decoding request attends to its whole context
        kv_read = decode_contexts_sum
        for start, n in context_chunks:
            prefill_tokens += n
            attended += n * start + n * (n + 1) // 2  # causal: token j attends start + j + 1 keys
            kv_read += start + n
        tokens = prefill_tokens + num_decode
        if tokens == 0:
            return 0.0
        sampled = len(context_chunks) + num_decode
        flops = 2.0 * self.matmul_params * tokens + 2.0 * s.vocab_size * s.hidden_size * sampled
        flops += 4.0 * s.num_layers * s.num_heads * s.head_dim * attended
        flops /= self.tp
        nbytes = self.weights_bytes + kv_tok * (kv_read + tokens)
        t_mem = nbytes / (self.bandwidth_gbs * 1e9 * self.bw_eff)
        t_flop = flops / (self.tflops * 1e12 * self.flop_eff)
        return self.overhead_s + max(t_mem, t_flop)

    def prefill_seconds(self, start: int, end: int, chunk: int) -> float:
        """Prompt tokens [start, end) of one request prefilled alone in chunks of ``chunk`` tokens (the fewest
        steps): the step model's time, attention over the context already read included."""
        t, pos = 0.0, start
        while pos < end:
            n = min(chunk, end - pos)
            t += self.step_seconds([(pos, n)], 0, 0)
            pos += n
        return t
