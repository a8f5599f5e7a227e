"""Where `trtforge build` spends its time and memory: trtforge's own steps vs TensorRT's parse and build.

For the example Llama (2 layers, hidden 256) and a larger Llama-like export (``examples.llama.BIGGER``: 4 layers,
hidden 512, vocab 4096), each in a fresh subprocess (so ``ru_maxrss`` is that build's own peak), with TensorRT-RTX
for the a100 profile (bf16, SM 8.0, two optimization profiles):

- time: ``BuildTimings`` per step; own = load/shape plan/sha256 ("prepare") + precision conversion + fold + writing
  model.onnx + writing plan/manifest; TensorRT = parse + build. The anchor is TensorRT's own time in the same run;
  the printed ratio is own / total. Target: own well under 10%.
- memory: a second build of the same model under ``tracemalloc`` (Python heap peak; tracemalloc slows Python code, so
  it is measured separately from the timings) and ``ru_maxrss`` (process peak RSS, includes TensorRT's native heap),
  next to the RSS after importing TensorRT-RTX (the floor).

Run: ``python bench/build.py [--repeat N] [--tmp DIR]`` (each model is built N times per subprocess; the median is
reported). ``--tmp`` picks where the source model and the engine folders are written (default: the system temporary
folder); pointing it at a tmpfs such as /dev/shm separates trtforge's own compute from the disk's write cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODELS = {"example (2x256)": "small", "bigger (4x512, vocab 4096)": "bigger"}
OWN = ("prepare", "convert", "fold", "write_onnx", "write_plan")
TRT = ("parse", "build")


def _one(kind: str, repeat: int, tmp_root: str | None) -> dict:
    """Runs inside the subprocess."""
    import resource
    import time
    import tracemalloc

    import onnx

    from trtforge.build_engine.builder import BuildTimings, build_engine
    from trtforge.examples.llama import BIGGER, LlamaConfig, make_llama

    import tensorrt_rtx  # noqa: F401  (import cost is not part of a build)

    rss_floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cfg = BIGGER if kind == "bigger" else LlamaConfig()
    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
        src = Path(tmp) / "model.onnx"
        onnx.save(make_llama(cfg), src)
        runs = []
        for k in range(repeat):
            t = BuildTimings()
            start = time.perf_counter()
            build_engine(src, "a100", Path(tmp) / f"e{k}", progress=False, timings=t)
            wall = time.perf_counter() - start
            runs.append({**t.steps, "wall": wall})
        tracemalloc.start()
        build_engine(src, "a100", Path(tmp) / "traced", progress=False)
        _, py_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        onnx_mb = src.stat().st_size / 2**20
        plan_mb = (Path(tmp) / "e0" / "model.plan").stat().st_size / 2**20
    med = {key: statistics.median(r.get(key, 0.0) for r in runs) for key in runs[0]}
    return {"steps": med, "py_peak_mb": py_peak / 2**20, "rss_floor_mb": rss_floor / 1024,
            "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "onnx_mb": onnx_mb, "plan_mb": plan_mb, "repeat": repeat}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmp", default=None, help="folder for the source model and engines (default: system temp)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.repeat, args.tmp)))
        return 0
    where = args.tmp or tempfile.gettempdir()
    print(f"trtforge build, profile a100 (TensorRT-RTX, bf16, SM 8.0), median of {args.repeat} builds per model, "
          f"files in {where}")
    header = f"{'model':28} {'onnx MB':>7} {'plan MB':>7} {'own s':>7} {'TRT s':>7} {'own/total':>9} " \
             f"{'py peak MB':>10} {'RSS peak MB':>11} {'RSS floor MB':>12}"
    print(header)
    results = {}
    for label, kind in MODELS.items():
        cmd = [sys.executable, __file__, "--one", kind, "--repeat", str(args.repeat)]
        proc = subprocess.run(cmd + (["--tmp", args.tmp] if args.tmp else []), capture_output=True, text=True,
                              check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        own = sum(r["steps"].get(k, 0.0) for k in OWN)
        trt = sum(r["steps"].get(k, 0.0) for k in TRT)
        r["own_s"], r["trt_s"], r["own_share"] = own, trt, own / (own + trt)
        results[label] = r
        print(f"{label:28} {r['onnx_mb']:7.1f} {r['plan_mb']:7.1f} {own:7.3f} {trt:7.3f} {r['own_share']:9.1%} "
              f"{r['py_peak_mb']:10.1f} {r['rss_peak_mb']:11.0f} {r['rss_floor_mb']:12.0f}")
    print("\nper step (median seconds):")
    for label, r in results.items():
        print(f"  {label}: " + ", ".join(f"{k} {r['steps'].get(k, 0.0):.3f}" for k in (*OWN, *TRT)))
    worst = max(r["own_share"] for r in results.values())
    print(f"\ntrtforge's own steps: at most {worst:.1%} of the build (target: well under 10%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
