"""Every trtforge command on a model over 2 GiB: wall time and peak RSS per command, against onnxslim and
``polygraphy convert`` on the same model.

The model is ``examples.big_llama.write_big_llama`` (the example Llama, 1 layer at hidden 256, vocabulary
1,050,000: 2.00 GiB of fp32 weights in one external-data file). Each command runs in its own fresh measuring
process, which starts the command as its child and reads ``resource.getrusage(RUSAGE_CHILDREN)`` after it exits, so
``ru_maxrss`` is that one command's peak RSS (kB on Linux) and nothing else's. The ratio printed is peak RSS over
the weights' size (the target in issue 18 is 1.5x), and each time is the command's whole wall time (process start,
imports, load, work, save), next to its CPU time
(user + system, all threads), which does not depend on how busy the machine is.

``quantize`` runs once per mode (generated calibration: 16 samples of 32 tokens); ``--quantize-lm-head`` puts the
1 GiB LM head through int8 (the largest single weight conversion).

Anchors measured in the same run: ``onnxslim`` (what ``fold`` does; python API in a subprocess, saving with external
data) and ``polygraphy convert`` with TensorRT-RTX (what ``build`` does; same shape ranges as the a100 profile's).

Run: ``python bench/scale.py [--tmp DIR] [--only NAME,...] [--skip-anchors]``. Needs about 12 GB of free disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_MEASURE = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": p.returncode, "wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss,
                  "err": p.stderr[-600:]}))
"""

_SLIM = """
import sys, onnx, onnxslim
m = onnxslim.slim(sys.argv[1])
onnx.save_model(m, sys.argv[2], save_as_external_data=True, location=sys.argv[2].rsplit('/', 1)[-1] + '.data')
"""


def measure(argv: list[str], env: dict[str, str] | None = None) -> dict:
    """Run ``argv`` as the only child of a fresh process; its wall time and peak RSS."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def commands(w: Path, exe: str) -> list[tuple[str, list[str], dict[str, str] | None]]:
    big, f16, b16, lora = w / "big.onnx", w / "fp16.onnx", w / "bf16.onnx", w / "lora.onnx"
    poly_env = dict(os.environ, POLYGRAPHY_USE_TENSORRT_RTX="1")
    shapes = ["--trt-min-shapes", "input_ids:[1,1]", "--trt-opt-shapes", "input_ids:[4,128]",
              "--trt-max-shapes", "input_ids:[8,1024]"]
    return [
        ("fold", [exe, "fold", str(big), "-o", str(w / "fold.onnx")], None),
        ("fold --check", [exe, "fold", str(big), "-o", str(w / "fold.onnx"), "--check"], None),
        ("onnxslim (anchor for fold)", [sys.executable, "-c", _SLIM, str(big), str(w / "slim.onnx")], None),
        ("precision --to fp16", [exe, "precision", str(big), "-o", str(f16), "--to", "fp16"], None),
        ("precision --to bf16", [exe, "precision", str(big), "-o", str(b16), "--to", "bf16"], None),
        ("lora inject (fp16)", [exe, "lora", "inject", str(f16), "-o", str(lora), "--targets", "q_proj,v_proj"], None),
        ("lora decompose", [exe, "lora", "decompose", str(lora), "-o", str(w / "dec.onnx")], None),
        ("diff fp16 vs fp32", [exe, "diff", str(f16), str(big), "--precision", "fp16", "--shape", "input_ids:1,4"],
         None),
        ("diff lora vs fp16", [exe, "diff", str(lora), str(f16), "--precision", "fp16", "--shape", "input_ids:1,4",
                               "--shape", "lora_slot_ids:1,4", "--value", "lora_slot_ids=-1",
                               "--extra-inputs"], None),
        ("build a100 (bf16 in)", [exe, "build", str(b16), "--profile", "a100", "-o", str(w / "eng"),
                                  "--backend", "tensorrt-rtx", "--no-progress", "--force"], None),
        ("polygraphy convert (anchor for build)", [str(Path(exe).with_name("polygraphy")), "convert", str(b16),
                                                  "-o", str(w / "poly.plan"), *shapes], poly_env),
        ("triton", [exe, "triton", str(w / "eng"), "--repo", str(w / "repo"), "--name", "big", "--force"], None),
        ("kv-plan", [exe, "kv-plan", "--profile", "a100", "--model", str(w / "config.json")], None),
        *[(f"quantize {' '.join(flags)}", [exe, "quantize", str(big), "-o", str(w / f"q{i}.onnx"), *flags], None)
          for i, flags in enumerate((["--mode", "int8"], ["--mode", "int8", "--calibrator", "percentile"],
                                     ["--mode", "int4-wo"], ["--mode", "fp8"],
                                     ["--mode", "int8", "--quantize-lm-head"]))],
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tmp", help="work folder's parent (default: the system temporary folder)")
    ap.add_argument("--only", help="comma-separated name prefixes of the commands to run")
    ap.add_argument("--exclude", help="comma-separated exact names of commands not to run")
    ap.add_argument("--skip-anchors", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    from trtforge.examples.big_llama import write_big_llama, write_hf_config

    exe = str(Path(sys.executable).with_name("trtforge"))
    work = Path(tempfile.mkdtemp(prefix="trtforge-scale-", dir=args.tmp))
    try:
        t = time.perf_counter()
        big = write_big_llama(work / "big.onnx")
        write_hf_config(work / "config.json", big.config)
        gib = big.weight_bytes / 2**30
        print(f"model: {big.path} ({gib:.2f} GiB of weights, written in {time.perf_counter() - t:.1f} s)")
        only = [s.strip() for s in args.only.split(",")] if args.only else None
        rows = []
        for name, argv, env in commands(work, exe):
            if args.skip_anchors and "anchor" in name:
                continue
            if only and not any(name.startswith(o) for o in only):
                continue
            if args.exclude and name in args.exclude.split(","):
                continue
            r = measure(argv, env)
            ratio = r["maxrss_kb"] * 1024 / big.weight_bytes
            last = r["err"].strip().splitlines()[-1] if r["err"].strip() else ""
            status = "ok" if r["rc"] == 0 else f"exit {r['rc']}: {last}"
            rows.append((name, r["wall"], r["cpu"], r["maxrss_kb"] / 2**20, ratio, status))
            print(f"{name:40s} {r['wall']:7.1f} s  {r['cpu']:7.1f} cpu-s  {r['maxrss_kb'] / 2**20:6.2f} GiB  "
                  f"{ratio:4.2f}x  {status}", flush=True)
        print(f"\n| command | wall s | CPU s (user+sys) | peak RSS GiB | peak / weights ({gib:.2f} GiB) | status |\n"
              "|---|---|---|---|---|---|")
        for name, wall, cpu, rss, ratio, status in rows:
            print(f"| {name} | {wall:.1f} | {cpu:.1f} | {rss:.2f} | {ratio:.2f}x | {status} |")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
