"""build-matrix against a sequential loop of `trtforge build`, on the same machine in one run.

An 8-cell matrix (4 models: the example Llama in fp32 and fp16-autocast, each with and without LoRA plugin nodes,
x profiles a10 and a100, all TensorRT-RTX) is built four ways:
  1. sequential: one `trtforge build` process per cell, one after the other (the anchor);
  2. `build-matrix --executor local --jobs 2`;
  3. `build-matrix --executor ray` on a local Ray cluster (started first, its start timed separately);
  4. a fully cached rerun.
Prints the speedups, Ray's overhead per cell (its wall time minus the local executor's, per cell, and the round trip
of an empty task) and the cached-rerun time. Needs tensorrt-rtx and ray (pip install 'trtforge[rtx,cluster]').

    python bench/build_matrix.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _models(work: Path) -> list[tuple[str, Path]]:
    from trtforge.build_engine.core.onnx_io import load_model
    from trtforge.build_engine.core.onnx_save import save_model
    from trtforge.examples.make_example import write_example
    from trtforge.plugins.lora.inject import inject

    paths = write_example(work / "src", seed=3)
    out = [("llama", paths["fp32"]), ("llama16", paths["fp16-autocast"])]
    for name, path in list(out):
        lora = work / "src" / f"{name}_lora.onnx"
        save_model(inject(load_model(path), ["q_proj", "v_proj"], 16, 8), lora)
        out.append((f"{name}_lora", lora))
    return out


def _matrix(work: Path, models: list[tuple[str, Path]]) -> Path:
    lines = ['[matrix]', 'profiles = ["a10", "a100"]', 'backend = "tensorrt-rtx"', '']
    for name, path in models:
        lines += ['[[model]]', f'path = "{path}"', f'name = "{name}"', '[model.pipeline]', 'fold = false', '']
    path = work / "matrix.toml"
    path.write_text("\n".join(lines))
    return path


def _timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    exe = str(Path(sys.executable).with_name("trtforge"))
    models = _models(work)
    matrix = _matrix(work, models)
    cells = [(n, p, prof) for n, p in models for prof in ("a10", "a100")]

    t0 = time.perf_counter()
    for name, path, prof in cells:
        (work / "seq" / name).mkdir(parents=True, exist_ok=True)
        subprocess.run([exe, "build", str(path), "--profile", prof, "-o", str(work / "seq" / name / prof),
                        "--backend", "tensorrt-rtx", "--no-progress"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    seq = time.perf_counter() - t0
    local = _timed([exe, "build-matrix", str(matrix), "-o", str(work / "local"), "--jobs", "2"])
    cached = _timed([exe, "build-matrix", str(matrix), "-o", str(work / "local"), "--jobs", "2"])

    import ray

    from trtforge.build_engine.matrix.cells import node_resources
    from trtforge.build_engine.matrix.driver import run_matrix
    from trtforge.build_engine.matrix.spec import load_matrix

    t0 = time.perf_counter()
    ray.init(num_cpus=2, resources=node_resources(), include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    start = time.perf_counter() - t0
    noop = ray.remote(lambda: None)
    ray.get(noop.remote())
    t0 = time.perf_counter()
    for _ in range(20):
        ray.get(noop.remote())
    rtt = (time.perf_counter() - t0) / 20
    t0 = time.perf_counter()
    report = run_matrix(load_matrix(matrix), work / "ray", executor="ray", jobs=2)
    ray_wall = time.perf_counter() - t0
    ray.shutdown()
    assert report.ok, [c.reason for c in report.cells]

    n = len(cells)
    print(f"cells: {n} (4 models x a10, a100; TensorRT-RTX)")
    print(f"sequential trtforge build loop : {seq:6.2f} s  (anchor)")
    print(f"build-matrix local --jobs 2    : {local:6.2f} s  speedup x{seq / local:.2f} (target >= 1.7)")
    print(f"build-matrix ray (cluster up)  : {ray_wall:6.2f} s  speedup x{seq / ray_wall:.2f}; "
          f"cluster start {start:.2f} s")
    print(f"ray overhead per cell          : {(ray_wall - local) / n:+6.3f} s vs local (target < 1 s); "
          f"empty task round trip {rtt * 1e3:.2f} ms")
    print(f"fully cached rerun             : {cached:6.2f} s  (target < 2 s)")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
