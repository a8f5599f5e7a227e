"""Small LoRA kernel launches for compute-sanitizer (memcheck / racecheck / synccheck); run by tests/gpu/run_all.sh.

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/sanitize_lora.py

Covers the fused kernel (sort, shrink, expand; tail tiles; slot -1 and out-of-range ids; per-sequence; a launch
sequence on one scratch), the scratch-free kernel (in place and out of place), run_op's copy path, the Triton
kernel (three configs), the plugin's default path and lora_prepare + a fused launch reading its metadata, on
sizes small enough for the sanitizer's slowdown. Exits 1 if a result is wrong (the sanitizer reports memory
errors).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_lora_kernel as t  # noqa: E402
import test_lora_prepare_gpu as pg  # noqa: E402


def main() -> int:
    t._gpu_or_skip()
    dev = t.Device()
    cases = [
        ("fused T1 fp16", t.make_case(1, 300, 200, 16, 8, seed=1), "float16", "fused"),
        ("fused T37 bf16 r64", t.make_case(37, 1000, 700, 64, 8, seed=2), "bfloat16", "fused"),
        ("fused T40 fp32 padded", t.make_case(40, 257, 130, 64, 3, seed=3, adapter_rank=5), "float32", "fused"),
        ("fused per-seq fp16", t.make_case(32, 130, 96, 8, 4, seed=4, per_sequence=True), "float16", "fused"),
        ("fused T300 fp16", t.make_case(300, 512, 640, 16, 8, seed=5), "float16", "fused"),
        ("simple T37 bf16", t.make_case(37, 1000, 700, 16, 8, seed=6), "bfloat16", "simple"),
        ("simple in place T9 fp16", t.make_case(9, 300, 2100, 16, 8, seed=7), "float16", "simple_inplace"),
        ("run_op T20 fp16", t.make_case(20, 300, 200, 8, 8, seed=8), "float16", "op"),
        ("triton0 T7 bf16 r16", t.make_case(7, 300, 200, 16, 8, seed=9), "bfloat16", "triton0"),
        ("triton1 T40 fp32 r64", t.make_case(40, 257, 130, 64, 3, seed=10), "float32", "triton1"),
        ("triton3 T70 fp16 r8", t.make_case(70, 130, 300, 8, 5, seed=11), "float16", "triton3"),
        ("plugin T129 fp16", t.make_case(129, 200, 100, 16, 8, seed=12), "float16", "plugin"),
        ("prepared T300 bf16", t.make_case(300, 512, 640, 16, 8, seed=13), "bfloat16", "prepared"),
        ("prepared T5 fp16 4096 slots", t.make_case(5, 130, 96, 8, 4096, seed=14), "float16", "prepared"),
    ]
    cases[1][1]["ids"][:3] = 8  # out of range: no adapter
    failures = 0
    for name, case, dtype, mode in cases:
        try:
            if mode == "prepared":
                got, y_seen = pg.run_prepared(dev, case, dtype)
            else:
                got, y_seen = t.run_kernel(dev, case, dtype, mode)
            t.check(case, got, y_seen, dtype, name)
            print(f"ok   {name}", flush=True)
        except AssertionError as exc:
            failures += 1
            dev.ptrs.clear()
            print(f"FAIL {name}: {exc}", flush=True)
    dev.close()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
