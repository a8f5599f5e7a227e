"""Sort once per forward on a real GPU: ``lora_prepare`` then fused launches reading its metadata, against float64.

Same helpers as test_lora_kernel.py. ``run_prepared`` is one node (prepare into a garbage-filled buffer, then the
fused kernel with ``meta``); ``test_one_forward_of_several_layers`` runs 3 layers of one forward through
``small_launch.run_variant`` with a context token, exactly as ``enqueue`` does: one launcher (scratch, metadata
buffer) per layer, the first layer prepares, the others read its buffer. Skipped without a CUDA device.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_lora_kernel as t  # noqa: E402
from test_lora_kernel import pytest  # noqa: E402  (pytest or the plain-run stand-in)

dev = t.dev  # the module-scoped Device fixture


def run_prepared(d: t.Device, case: dict, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(output, y as read) of lora_prepare + the fused kernel with its metadata, in place."""
    from trtforge.plugins.lora.launch import meta_bytes

    fields, y, ptr, common = t._upload(d, case, dtype)
    tokens, tps = common["num_tokens"], common["tokens_per_slot"]
    meta = d.put(np.full(meta_bytes(tokens, fields.num_slots) // 4, -7, np.int32))
    d.launcher.prepare(0, slot_ids=ptr["ids"], meta=meta, num_tokens=tokens, num_slots=fields.num_slots,
                       tokens_per_slot=tps)
    d.launcher.launch(0, fields, dtype, y=ptr["y"], meta=meta, **common)
    got = d.get(ptr["y"], y)
    d.release()
    return t.from_device_dtype(got, dtype), t.from_device_dtype(y, dtype)


CASES = list(itertools.product([1, 7, 128, 2048], [8, 4096], ["float16", "bfloat16", "float32"]))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,slots,dtype", CASES, ids=[f"T{a}-N{b}-{c}" for a, b, c in CASES])
def test_prepared_fused_matches_float64(dev, tokens, slots, dtype):
    case = t.make_case(tokens, 1000, 1500, 16, slots, seed=tokens + slots)
    case["ids"][:2] = slots  # out of range: no adapter
    got, y_seen = run_prepared(dev, case, dtype)
    t.check(case, got, y_seen, dtype, f"prepared T{tokens} N{slots} {dtype}")
    seq = t.make_case(64, 512, 384, 8, 4, seed=8, per_sequence=True)
    got, y_seen = run_prepared(dev, seq, dtype)
    t.check(seq, got, y_seen, dtype, f"prepared per-sequence {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_one_forward_of_several_layers(dev, dtype):
    """3 layers, 2 forwards (new slot ids, same shape) at 512 tokens (the fused path under AUTO), out of place."""
    from trtforge.plugins.lora.forward_meta import REGISTRY
    from trtforge.plugins.lora.launch import LoraLauncher, meta_bytes
    from trtforge.plugins.lora.small_launch import run_variant
    from trtforge.plugins.lora.variants import AUTO

    tokens, n = 512, 8
    launchers = [LoraLauncher() for _ in range(3)]
    for la in launchers:
        la.reserve_meta(meta_bytes(tokens, n))
    context = 0x5EED + hash(dtype) % 1000
    try:
        for fwd in range(2):
            cases = [t.make_case(tokens, 1000, 768, 16, n, seed=100 * fwd + i) for i in range(3)]
            ids = cases[0]["ids"]
            ids_ptr = dev.put(ids)
            for i, (case, la) in enumerate(zip(cases, launchers, strict=True)):
                case["ids"] = ids
                fields, y, ptr, common = t._upload(dev, case, dtype)
                common["slot_ids"] = ids_ptr  # one slot_ids tensor for every layer of the forward
                out = dev.put(t._nan_like(y))
                run_variant(la, 0, fields, dtype, AUTO, y=ptr["y"], out=out, context=context, owner=i, **common)
                got = dev.get(out, y)
                t.check(case, t.from_device_dtype(got, dtype), t.from_device_dtype(y, dtype), dtype,
                        f"forward {fwd} layer {i} {dtype}")
            dev.release()
    finally:
        for i, la in enumerate(launchers):
            REGISTRY.forget(i)
            la.close()


if __name__ == "__main__":
    t._gpu_or_skip()
    d = t.Device()
    for tok, slots, dt in CASES:
        test_prepared_fused_matches_float64(d, tok, slots, dt)
    for dt in ("float16", "bfloat16"):
        test_one_forward_of_several_layers(d, dt)
    d.close()
    print("ok")
