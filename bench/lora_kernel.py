"""Benchmark: the fused LoRA kernel (y += s * (x @ A[s]) @ B[s], per-token slots) against torch, same GPU, same run.

Each case is timed two ways: ``triton.testing.do_bench`` median (it flushes L2 between calls) and CUDA-graph replay
of 20 calls (per call = replay / 20). Anchors: torch single adapter ``y.addmm_(x @ A, B)`` and torch per-token
8-adapter gather ``bmm(x, A[idx])`` then ``bmm(v, B[idx])``; a no-op kernel (cupy, if present) for the launch
floor; and at 2048 tokens the bytes-moved floor (read x and y, write y, read the pools) at the copy bandwidth
measured in this run. Prints a table with ratios; with $OUT set, writes lora_kernel.json and lora_kernel.md there.

torch is used only for allocation and as the anchor: our kernel gets raw device pointers through the cuda-python
launcher (trtforge.plugins.lora.launch). Needs a CUDA GPU, torch and triton; exits 0 with a note otherwise.
Run: python bench/lora_kernel.py [--tokens 1,7,...] [--rank 16] [--slots 8] [--hidden 4096] [--dtype float16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _graph_per_call(fn, calls: int = 20, replays: int = 30) -> float:  # type: ignore[no-untyped-def]
    """Microseconds per call inside a CUDA graph holding ``calls`` calls."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    times.sort()
    return times[len(times) // 2]


def _copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s (read + write), median of do_bench on a 1 GiB copy."""
    import torch
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)


def _noop_us() -> tuple[float | None, float | None]:
    try:
        import cupy as cp
        from triton.testing import do_bench
    except ImportError:
        return None, None
    kernel = cp.RawKernel(r'extern "C" __global__ void noop() {}', "noop")
    import torch

    def run() -> None:
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((1,), (32,), ())

    return do_bench(run, return_mode="median") * 1000, _graph_per_call(run)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,7,16,32,64,128,512,2048")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    args = ap.parse_args(argv)
    try:
        import torch
        from triton.testing import do_bench
    except ImportError as exc:
        print(f"bench/lora_kernel.py: skipped ({exc}); needs torch and triton on a CUDA machine")
        return 0
    if not torch.cuda.is_available():
        print("bench/lora_kernel.py: skipped (no CUDA GPU)")
        return 0

    from trtforge.plugins.lora import spec
    from trtforge.plugins.lora.launch import LoraLauncher, plan_launch

    torch.manual_seed(0)
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    h = o = args.hidden
    r, n = args.rank, args.slots
    gpu = torch.cuda.get_device_name()
    launcher = LoraLauncher()
    fields = spec.LoraFields(max_rank=r, num_slots=n, in_features=h, out_features=o, tile=spec.DEFAULT_TILE)
    a = (torch.randn(n, h, r, device="cuda") / h**0.5).to(dt)
    b = (torch.randn(n, r, o, device="cuda") / r**0.5).to(dt)
    scales = torch.rand(n, device="cuda", dtype=torch.float32) + 0.5
    bw = _copy_bandwidth()
    noop_bench, noop_graph = _noop_us()
    rows = []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        x = torch.randn(tokens, h, device="cuda").to(dt)
        y = torch.randn(tokens, o, device="cuda").to(dt)
        ids = torch.randint(0, n, (tokens,), device="cuda", dtype=torch.int32)
        ids_long = ids.long()
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

        def ours() -> None:
            launcher.launch(stream(), fields, args.dtype, x=x.data_ptr(), y=y.data_ptr(), lora_a=a.data_ptr(),
                            lora_b=b.data_ptr(), slot_ids=ids.data_ptr(), scales=scales.data_ptr(),
                            num_tokens=tokens)

        a0, b0 = a[0] * float(scales[0]), b[0]

        def torch_single() -> None:
            y.addmm_(x @ a0, b0)

        def torch_gather() -> None:
            v = torch.bmm(x.unsqueeze(1), a[ids_long])
            y.add_(torch.bmm(v, b[ids_long]).squeeze(1))

        # correctness guard before timing (fp32 torch math on the same inputs)
        y0 = y.clone()
        ours()
        torch.cuda.synchronize()
        want = y0.float() + scales[ids_long].unsqueeze(1) * torch.bmm(
            torch.bmm(x.float().unsqueeze(1), a.float()[ids_long]), b.float()[ids_long]).squeeze(1)
        err = ((y.float() - want).abs().max() / want.abs().max()).item()
        y.copy_(y0)

        t = {}
        for name, fn in (("ours", ours), ("torch_single", torch_single), ("torch_gather", torch_gather)):
            t[name] = (do_bench(fn, return_mode="median") * 1000, _graph_per_call(fn))
            y.copy_(y0)
        moved = (x.numel() + 2 * y.numel() + a.numel() + b.numel()) * x.element_size() + ids.numel() * 4
        floor_us = moved / bw * 1e6
        p = plan_launch(fields, tokens, args.dtype, sm_count=launcher.sm_count)
        rows.append({
            "tokens": tokens, "ours_bench_us": t["ours"][0], "ours_graph_us": t["ours"][1],
            "single_bench_us": t["torch_single"][0], "single_graph_us": t["torch_single"][1],
            "gather_bench_us": t["torch_gather"][0], "gather_graph_us": t["torch_gather"][1],
            "floor_us": floor_us, "rel_err": err, "grid": p.grid[0], "n_hs": p.n_hs, "n_ot": p.n_ot,
        })
        del x, y, ids, ids_long, y0, want
    header = (f"LoRA kernel, {gpu}, {args.dtype}, H=O={h}, rank {r}, {n} slots, random per-token slots; "
              f"copy bandwidth {bw / 1e12:.2f} TB/s"
              + (f"; no-op kernel {noop_bench:.1f} us (do_bench) / {noop_graph:.2f} us (graph)" if noop_bench else ""))
    lines = [header, "",
             "| tokens | ours do_bench us | ours graph us | torch 1-adapter (bench/graph) | torch gather (bench/graph) "
             "| x faster than 1-adapter (bench/graph) | x faster than gather (bench/graph) | ours / bytes floor "
             "| max rel err |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(
            f"| {row['tokens']} | {row['ours_bench_us']:.2f} | {row['ours_graph_us']:.2f} "
            f"| {row['single_bench_us']:.2f} / {row['single_graph_us']:.2f} "
            f"| {row['gather_bench_us']:.2f} / {row['gather_graph_us']:.2f} "
            f"| {row['single_bench_us'] / row['ours_bench_us']:.2f} / {row['single_graph_us'] / row['ours_graph_us']:.2f} "
            f"| {row['gather_bench_us'] / row['ours_bench_us']:.2f} / {row['gather_graph_us'] / row['ours_graph_us']:.2f} "
            f"| {row['ours_bench_us'] / row['floor_us']:.2f} | {row['rel_err']:.1e} |")
    text = "\n".join(lines)
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        meta = {"date": time.strftime("%Y-%m-%d"), "gpu": gpu, "dtype": args.dtype, "hidden": h, "rank": r,
                "slots": n, "copy_bandwidth_Bps": bw, "noop_bench_us": noop_bench, "noop_graph_us": noop_graph}
        Path(out, "lora_kernel.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        Path(out, "lora_kernel.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
