"""The error of a KV plan without one block (``kv_plan.plan_kv``): the sizes, and what would fit one request.

A larger ``--tp`` is judged as ``plan_kv`` would plan it, with the weights *and* the activations at that tp (they
shard too: judged with tp 1's activations, llama-3.1-8b at ``--max-num-tokens 700000`` on an h100 fitted at no tp,
while ``--tp 2`` plans 84 requests); a smaller ``--max-num-tokens`` is named where the activations outweigh the
weights (no GPU or tp then helps as much).
"""

from __future__ import annotations

from typing import Any

from trtforge.build_engine.core.errors import InputError

from .kv_weights import DTYPE_BYTES, GIB, RUNTIME_RESERVE_BYTES, activation_bytes, valid_tps


def no_fit(profile: Any, spec: Any, tp: int, dtypes: tuple[str, str], sizes: tuple[int, int, int, int],
           fraction: float, used: tuple[int, int]) -> InputError:
    """A plan without one KV block: its sizes and what fits one request (each larger --tp with its own activations)."""
    (wdt, kdt), (request_tokens, max_num_tokens, max_batch, tpb), (weights, act) = dtypes, sizes, used
    gpu, g = int(profile.hardware.memory_gb * GIB), GIB

    def fits(t: int) -> bool:
        act_t = activation_bytes(spec, DTYPE_BYTES[wdt], max_num_tokens, max_batch, t)
        kv = (gpu - spec.weights_bytes(wdt, t) - act_t - RUNTIME_RESERVE_BYTES) * fraction
        return kv >= spec.kv_bytes_per_token(kdt, t) * tpb * max(1, -(-request_tokens // tpb))

    larger = [t for t in valid_tps(spec) if t > tp] or [tp]  # only sizes that split the heads
    fit = [t for t in larger if fits(t)]
    hint = f"--tp {fit[0]} fits" if fit else f"not even --tp {larger[-1]} fits"
    tokens = f", a smaller --max-num-tokens (activations of {max_num_tokens} tokens)" if act > weights else ""
    quant = f" (its quantization_config, {spec.quantization}, is not modelled: weights sized as {wdt})" * (
        spec.quantization != "" and spec.weight_quant is None)
    return InputError(
        f"model {spec.name} does not fit profile {profile.name}: weights {weights / g:.1f} GiB + activations "
        f"{act / g:.1f} GiB + reserve {RUNTIME_RESERVE_BYTES / g:.1f} GiB per GPU vs {gpu / g:.1f} GiB of GPU memory "
        f"at --tp {tp}; use a GPU with more memory, a larger --tp ({hint} one {request_tokens}-token request){tokens}, "
        f"or fp8 weights{quant}")
