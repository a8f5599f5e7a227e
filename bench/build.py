"""Where `trtforge build` spends its time and memory: trtforge's own steps vs TensorRT's parse and build.

For the example Llama (2 layers, hidden 256) and a larger Llama-like export (``examples.llama.BIGGER``: 4 layers,
hidden 512, vocab 4096), each in a fresh subprocess (so ``ru_maxrss`` is that build's own peak), with TensorRT-RTX
for the a100 profile (bf16, SM 8.0, two optimization profiles):

- time: ``build_engine``'s wall time, split by ``BuildTimings`` (its steps add up to the wall time) into three parts:
  TensorRT (creating builder/network/parser + parse, and build; the anchor, measured in the same run), trtforge's
  own compute (loading and checking the model, shape plan, precision conversion, folding, serialising the ONNX,
  configuring, freeing, and whatever fell between timed steps) and trtforge's own I/O (reading the source file;
  writing model.plan while hashing it, including any wait for the worker that writes model.onnx during the build;
  writing manifest.json). own = wall - TensorRT; the printed share is own / wall. Target: well under 10%.
- work on worker threads (hashing the source, writing model.onnx, creating the plan file during the build, writing
  the plan while the main thread hashes it) is listed with how long it ran; only the time a step waits for it is in
  the wall time. If no core is idle it can slow TensorRT's build instead, so an upper bound of own is own + that.
- a write probe: after the timed builds, the same process writes a plan-sized buffer that is already in memory to a
  new file beside the engines, outside trtforge's code. It shows what a plain write of that many bytes costs in this
  process at that moment (on some VMs, fresh pages for the file are slow to come by after a large build).
- memory: a second build of the same model under ``tracemalloc`` (Python heap peak; tracemalloc slows Python code, so
  it is measured separately from the timings) and ``ru_maxrss`` (process peak RSS, includes TensorRT's native heap),
  next to the RSS after importing TensorRT-RTX (the floor).

Big model (issue 18): ``python bench/build.py --big [--repeat N] [--tmp DIR]`` writes ``examples.big_llama`` (2 GiB
fp32), converts it with ``trtforge precision --to bf16`` (1 GiB of weights, so the build takes the as-is path, no
conversion), then builds it 2N times in one process, alternating the plan and model copies written with O_DIRECT
(the default) and through the page cache (``TRTFORGE_DIRECT_WRITE=0``, the anchor), and prints the own share of
each with PASS/MISS against 10%. Needs about 5 GB of free disk.

Run: ``python bench/build.py [--repeat N] [--tmp DIR]`` (each model is built N times per subprocess; medians are
reported, and the range of the own share over the N builds). ``--tmp`` picks where the source model and the engine
folders are written (default: the system temporary folder); a tmpfs such as /dev/shm takes the disk out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODELS = {"example (2x256)": "small", "bigger (4x512, vocab 4096)": "bigger"}


def _one(kind: str, repeat: int, tmp_root: str | None) -> dict:
    """Runs inside the subprocess."""
    import resource
    import time
    import tracemalloc

    import onnx
    import tensorrt_rtx  # noqa: F401  (import cost is not part of a build)

    from trtforge.build_engine.engine.builder import BuildTimings, build_engine
    from trtforge.examples.llama import BIGGER, LlamaConfig, make_llama

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
            runs.append({"steps": dict(t.steps), "background": dict(t.background), "wall": wall,
                         "trt": t.tensorrt, "io": t.own_io, "compute": t.own_compute})
        plan = (Path(tmp) / "e0" / "model.plan").read_bytes()
        probe_start = time.perf_counter()
        (Path(tmp) / "probe.bin").write_bytes(plan)
        write_probe = time.perf_counter() - probe_start
        del plan
        tracemalloc.start()
        build_engine(src, "a100", Path(tmp) / "traced", progress=False)
        _, py_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        onnx_mb = src.stat().st_size / 2**20
        plan_mb = (Path(tmp) / "e0" / "model.plan").stat().st_size / 2**20
    names = list(dict.fromkeys(k for r in runs for k in r["steps"]))  # in the order the build runs them
    steps = {k: statistics.median(r["steps"].get(k, 0.0) for r in runs) for k in names}
    bg_names = list(dict.fromkeys(k for r in runs for k in r["background"]))
    background = {k: statistics.median(r["background"].get(k, 0.0) for r in runs) for k in bg_names}
    shares = [(r["wall"] - r["trt"]) / r["wall"] for r in runs]
    return {"steps": steps, "background": background, "wall": statistics.median(r["wall"] for r in runs),
            "trt": statistics.median(r["trt"] for r in runs), "io": statistics.median(r["io"] for r in runs),
            "compute": statistics.median(r["compute"] for r in runs), "share": statistics.median(shares),
            "share_min": min(shares), "share_max": max(shares), "write_probe": write_probe,
            "py_peak_mb": py_peak / 2**20, "rss_floor_mb": rss_floor / 1024,
            "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "onnx_mb": onnx_mb, "plan_mb": plan_mb, "repeat": repeat}


def _big(repeat: int, tmp_root: str | None) -> int:
    """The big-model A/B (see the module docstring); runs in this process."""
    import os
    import resource
    import time

    from trtforge.build_engine.cli import main as cli
    from trtforge.build_engine.engine.builder import BuildTimings, build_engine
    from trtforge.examples.big_llama import write_big_llama

    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
        work = Path(tmp)
        write_big_llama(work / "big.onnx")
        if cli(["precision", str(work / "big.onnx"), "-o", str(work / "bf16.onnx"), "--to", "bf16", "-q"]) != 0:
            raise SystemExit("precision --to bf16 failed")
        for f in (work / "big.onnx", work / "big.onnx.data"):
            f.unlink()
        rows: dict[str, list[tuple[float, float, float]]] = {"1": [], "0": []}
        print(f"build a100 of the bf16 big Llama ({sum(f.stat().st_size for f in work.iterdir()) / 2**30:.2f} GiB), "
              f"{repeat} pairs alternated; own = wall - TensorRT (parse + build)")
        for k in range(2 * repeat):
            mode = "1" if k % 2 == 0 else "0"
            os.environ["TRTFORGE_DIRECT_WRITE"] = mode
            t = BuildTimings()
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            start = time.perf_counter()
            build_engine(work / "bf16.onnx", "a100", work / f"e{k}", progress=False, timings=t)
            wall = time.perf_counter() - start
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            used = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
            rows[mode].append((wall, t.tensorrt, used))
            label = "direct    " if mode == "1" else "page cache"
            print(f"  {label} wall {wall:6.2f} s  TensorRT {t.tensorrt:6.2f} s  own {wall - t.tensorrt:5.2f} s "
                  f"({(wall - t.tensorrt) / wall:5.1%})  process CPU {used:5.2f} s  load {os.getloadavg()[0]:.2f}  "
                  + ", ".join(f"{n} {v:.2f}" for n, v in t.steps.items() if v >= 0.05), flush=True)
            shutil.rmtree(work / f"e{k}")
        os.environ.pop("TRTFORGE_DIRECT_WRITE", None)
    share = {m: statistics.median((w - trt) / w for w, trt, _ in r) for m, r in rows.items()}
    cpu = {m: statistics.median(c for *_, c in r) for m, r in rows.items()}
    print(f"median own share: direct {share['1']:.1%}, page cache {share['0']:.1%} (same run); median process CPU "
          f"{cpu['1']:.2f} s vs {cpu['0']:.2f} s")
    print(f"{'PASS' if share['1'] < 0.10 else 'MISS'}: own share {share['1']:.1%} (target < 10%)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big", action="store_true", help="the big-model A/B instead (see the docstring)")
    ap.add_argument("--tmp", default=None, help="folder for the source model and engines (default: system temp)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.big:
        return _big(args.repeat, args.tmp)
    if args.one:
        print(json.dumps(_one(args.one, args.repeat, args.tmp)))
        return 0
    from trtforge.build_engine.engine.builder import BuildTimings

    where = args.tmp or tempfile.gettempdir()
    print(f"trtforge build, profile a100 (TensorRT-RTX, bf16, SM 8.0), median of {args.repeat} builds per model, "
          f"files in {where}")
    print("(medians per column over the builds, so compute + I/O need not add up exactly to own)")
    print(f"{'model':27} {'onnx MB':>7} {'plan MB':>7} {'wall s':>7} {'TRT s':>6} {'own s':>6} {'compute':>7} "
          f"{'I/O':>6} {'own/wall':>8} {'(range)':>13} {'py MB':>6} {'RSS MB':>6} {'floor':>5}")
    results = {}
    for label, kind in MODELS.items():
        cmd = [sys.executable, __file__, "--one", kind, "--repeat", str(args.repeat)]
        proc = subprocess.run(cmd + (["--tmp", args.tmp] if args.tmp else []), capture_output=True, text=True,
                              check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results[label] = r
        own = r["wall"] - r["trt"]
        rng = f"{r['share_min']:.1%}-{r['share_max']:.1%}"
        print(f"{label:27} {r['onnx_mb']:7.1f} {r['plan_mb']:7.1f} {r['wall']:7.3f} {r['trt']:6.3f} {own:6.3f} "
              f"{r['compute']:7.3f} {r['io']:6.3f} {r['share']:8.1%} {rng:>13} {r['py_peak_mb']:6.1f} "
              f"{r['rss_peak_mb']:6.0f} {r['rss_floor_mb']:5.0f}")
    io_steps = set(BuildTimings.IO)
    trt_steps = set(BuildTimings.TENSORRT)
    print("\nper step (median seconds; [io] = trtforge's disk I/O, [trt] = TensorRT, the rest trtforge's compute):")
    for label, r in results.items():
        parts = []
        for k, v in r["steps"].items():
            tag = " [io]" if k in io_steps else " [trt]" if k in trt_steps else ""
            parts.append(f"{k}{tag} {v:.3f}")
        print(f"  {label}: " + ", ".join(parts))
        print("    on worker threads, overlapping the steps above (not in the wall time; a step waiting for one "
              "counts the wait): " + ", ".join(f"{k} {v:.3f}" for k, v in r["background"].items()))
        print(f"    write probe (a plain {r['plan_mb']:.0f} MB write from this process after the builds): "
              f"{r['write_probe']:.3f} s")
    worst = max(r["share"] for r in results.values())
    print(f"\ntrtforge's own steps: at most {worst:.1%} of the build's wall time, median (target: well under 10%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
