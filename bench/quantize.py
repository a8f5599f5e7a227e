"""trtforge quantize vs NVIDIA ModelOpt (``modelopt.onnx.quantization.quantize``) on the same calibration samples.

For the example Llama and the bigger one (``examples.llama.BIGGER``), for int8, int4 weight-only and fp8: top-1
agreement of the logits and relative error ``||q - fp32|| / ||fp32||`` on held-out inputs (never used for
calibration), quantize wall time, and whether TensorRT-RTX builds the output (int8 / int4 for a100, SM 8.0; fp8 for
l40s, SM 8.9). ModelOpt is the anchor: it runs in its own venv (it pulls a CUDA torch; ``--modelopt-python``), with
``calibration_eps=["cpu"]``, ``high_precision_dtype="fp32"`` (so both sides keep the unquantized parts in fp32 and
the accuracy compares the quantization alone) and its default calibration per mode (entropy for int8/fp8,
awq_clip for int4); trtforge runs with its defaults (max calibrator, SmoothQuant alpha 0.5, AWQ search). Times:
trtforge's is the in-process ``quantize`` call plus the save; ModelOpt's is its ``quantize`` call (which saves), timed
inside its process, both excluding imports. If ModelOpt cannot run, the row says why and trtforge's numbers stand
alone.

    python bench/quantize.py [--models example,bigger] [--modes int8,int4-wo,fp8] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from trtforge.build_engine.quantize import QuantConfig, generate, quantize
from trtforge.examples.llama import BIGGER, LlamaConfig, make_llama

MODELS = {"example": LlamaConfig(), "bigger": BIGGER}
PROFILE = {"int8": "a100", "int4-wo": "a100", "fp8": "l40s"}
MO_MODE = {"int8": "int8", "int4-wo": "int4", "fp8": "fp8"}
MO_SCRIPT = """
import json, sys, time
import numpy as np
import modelopt.onnx.quantization as q
src, out, mode, calib = sys.argv[1:5]
data = dict(np.load(calib))
t = time.perf_counter()
q.quantize(src, quantize_mode=mode, calibration_data=data, calibration_eps=["cpu"], output_path=out,
           high_precision_dtype="fp32", log_level="ERROR")
print("RESULT " + json.dumps({"seconds": time.perf_counter() - t}))
"""


def _session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def accuracy(path: Path, feeds: list[dict[str, np.ndarray]], refs: list[np.ndarray]) -> dict[str, float | str]:
    try:
        sess = _session(path)
        outs = [sess.run(["logits"], f)[0] for f in feeds]
    except Exception as exc:  # noqa: BLE001  (reported in the table)
        return {"error": " ".join(str(exc).split())[:160]}
    top1 = float(np.mean([np.mean(a.argmax(-1) == r.argmax(-1)) for a, r in zip(outs, refs, strict=True)]))
    num = sum(float(((a - r) ** 2).sum()) for a, r in zip(outs, refs, strict=True))
    den = sum(float((r ** 2).sum()) for r in refs)
    return {"top1": top1, "rel_error": float(np.sqrt(num / den))}


def builds(path: Path, mode: str, work: Path) -> str:
    from trtforge.build_engine.core.errors import TrtforgeError
    from trtforge.build_engine.engine.builder import build_engine

    try:
        build_engine(path, PROFILE[mode], work / f"engine_{path.stem}", force=True, progress=False)
        return "yes"
    except TrtforgeError as exc:
        return "no: " + exc.message[:200]


def run_modelopt(python: str, src: Path, out: Path, mode: str, calib: Path, script: Path) -> dict[str, object]:
    if not Path(python).exists():
        return {"error": f"{python} not found (install ModelOpt in its own venv; see bench/RESULTS.md)"}
    proc = subprocess.run([python, str(script), str(src), str(out), MO_MODE[mode], str(calib)],
                          capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None or not out.exists():
        tail = " ".join((proc.stderr or proc.stdout).split())[-300:]
        return {"error": f"ModelOpt failed (exit {proc.returncode}): {tail}"}
    return json.loads(line[len("RESULT "):])


def bench_model(name: str, cfg: LlamaConfig, modes: list[str], args: argparse.Namespace, work: Path) -> list[dict]:
    src = work / f"{name}.onnx"
    model = make_llama(cfg)
    onnx.save(model, src)
    calib = generate(model, args.calib_size, args.seq, seed=0)
    calib_npz = work / f"{name}_calib.npz"
    np.savez(calib_npz, input_ids=np.concatenate([s["input_ids"] for s in calib.samples]))
    held = generate(model, args.held_out, args.seq, seed=999).samples
    ref = _session(src)
    refs = [ref.run(["logits"], dict(f))[0] for f in held]
    script = work / "run_modelopt.py"
    script.write_text(MO_SCRIPT)
    rows = []
    for mode in modes:
        out = work / f"{name}_{mode}_trtforge.onnx"
        t0 = time.perf_counter()
        result = quantize(model, QuantConfig(mode=mode), calib)
        onnx.save(result.model, out)
        t_tf = time.perf_counter() - t0
        tf = {"seconds": t_tf, **accuracy(out, held, refs), "builds": builds(out, mode, work)}
        mo_out = work / f"{name}_{mode}_modelopt.onnx"
        mo = run_modelopt(args.modelopt_python, src, mo_out, mode, calib_npz, script)
        if "error" not in mo:
            mo.update(accuracy(mo_out, held, refs))
            mo["builds"] = builds(mo_out, mode, work)
        rows.append({"model": name, "mode": mode, "trtforge": tf, "modelopt": mo})
        print(_row(rows[-1]), flush=True)
    return rows


def _fmt(side: dict) -> str:
    if "seconds" not in side:
        return f"error: {side.get('error')}"
    acc = (f"top-1 {side['top1']:.3f}, rel.err {side['rel_error']:.4f}" if "top1" in side
           else f"eval error: {side.get('error')}")
    return f"{side['seconds']:.2f} s, {acc}, builds: {side.get('builds')}"


def _row(r: dict) -> str:
    tf, mo = r["trtforge"], r["modelopt"]
    ratio = f"time ratio trtforge/ModelOpt {tf['seconds'] / mo['seconds']:.2f}" if "seconds" in mo else ""
    return f"{r['model']:8s} {r['mode']:8s}\n  trtforge: {_fmt(tf)}\n  ModelOpt: {_fmt(mo)}\n  {ratio}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="example,bigger")
    p.add_argument("--modes", default="int8,int4-wo,fp8")
    p.add_argument("--calib-size", type=int, default=16)
    p.add_argument("--held-out", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--modelopt-python", default="/work/modelopt-venv/bin/python")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="trtforge-bench-quant-") as tmp:
        for name in args.models.split(","):
            rows += bench_model(name, MODELS[name], args.modes.split(","), args, Path(tmp))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
