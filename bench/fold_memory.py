"""Issue 12's memory target (``fold``'s peak memory under 3x the model's serialized size), judged per model kind.

Each model is folded in a fresh process (memory an earlier fold freed would otherwise be reused without growing the
resident set): the growth of the RSS during ``fold(model)`` (the library call, which copies the model first; peak
``VmHWM`` reset through ``/proc/self/clear_refs``, minus the RSS before; Linux only) over the model's serialized size.
The same fold, in place (``inplace=True``, as ``trtforge fold`` runs it), is measured beside it. Kinds:

- the 27 torch exports of ``bench/fold_models.py`` (DistilBERT-, MiniLM-, Llama-like; fp32/fp16/autocast; three
  exporters): real transformer graphs, whose bytes are mostly weights;
- the weight-free synthetic graph of ``fold_synthetic.py`` at 100k nodes (32 bytes per node serialized), and that
  graph at 50k nodes plus a side chain of 50k ``Add`` nodes, each adding its own float32 weight of ``W`` bytes
  (100k nodes, about ``W / 2`` weight bytes per node), for ``W`` = 64 ... 4096: where between weight-free and real
  graphs the ratio crosses 3x. Real exports carry kilobytes of weights per node (the table's bytes/node column).

The baseline is live memory: freed C heap (building the model in Python leaves some) is trimmed before it is read, or
the fold's own trims would read as negative growth. Last, what validation alone costs (onnx's C++ checker and strict
shape inference on the folded weight-free skeleton, as ``pipeline._validate`` runs them) on the weight-free graph and
the 1 kB-weight graph: the floor under any pass view.

Run: ``python -P bench/fold_memory.py [--quick]`` (needs the ``bench`` extra for torch). Prints one row per model and
the verdict per kind. Each process first folds a tiny model that takes every code path (``_warm_up``): imports and
caches paid once per process are not the model's memory.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fold_scale import _status_kb  # noqa: E402

TARGET = 3.0
PRECISIONS = ("fp32", "fp16", "fp16-autocast")
EXPORTERS = ("dynamo", "dynamo-optimize", "torchscript")


def _weighted(n: int, weight_bytes: int) -> object:
    """The ``n``-node synthetic graph plus a live side chain (it feeds a second graph output) of ``n`` ``Add``
    nodes, each adding its own [1, k] float32 initializer (``k = weight_bytes / 4``) to the running sum."""
    import numpy as np
    import onnx
    from fold_synthetic import synthetic
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    model = synthetic(n)
    g = model.graph
    k = max(1, weight_bytes // 4)
    rng = np.random.default_rng(0)
    g.node.append(h.make_node("Flatten", ["x"], ["x_row"], axis=0))  # [1, 32]
    g.node.append(h.make_node("ReduceSum", ["x_row"], ["x_sum"], keepdims=1))  # [1, 1]
    acc = "x_sum"
    blocks = len(g.node) - 2
    for i in range(blocks):
        w = numpy_helper.from_array(rng.standard_normal((1, k)).astype(np.float32), f"w{i}")
        g.initializer.append(w)
        g.node.append(h.make_node("Add", [acc if i == 0 else f"s{i - 1}", f"w{i}"], [f"s{i}"]))
    g.output.append(onnx.helper.make_tensor_value_info(f"s{blocks - 1}", T.FLOAT, [1, k]))
    return model


def _load(spec: str) -> object:
    kind, _, arg = spec.partition(":")
    if kind == "synthetic":
        from fold_synthetic import synthetic

        return synthetic(int(arg))
    if kind == "weighted":
        n, w = arg.split(",")
        return _weighted(int(n), int(w))
    import fold_models as fm

    name, prec, exp = arg.split("/")
    return fm.export(name, prec, exp)


def _warm_up() -> None:
    """Fold a tiny model that takes every code path once (a constant expression under a Cast, evaluated through
    onnx.reference; an If with subgraphs; shape inference; validation): the lazy imports and caches a process pays
    once are not the model's memory. The warm-up's own model is a few kB, so the memory it frees and the fold
    measured next may reuse is negligible."""
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    from trtforge.build_engine.passes import fold

    c = numpy_helper.from_array(np.arange(4, dtype=np.int64), "c")
    branch = h.make_graph([h.make_node("Identity", ["y"], ["z"])], "b", [],
                          [h.make_tensor_value_info("z", T.FLOAT, [4])])
    nodes = [h.make_node("Add", ["c", "c"], ["c2"]), h.make_node("Cast", ["c2"], ["cf"], to=T.FLOAT),
             h.make_node("Add", ["x", "cf"], ["y"]), h.make_node("Cast", ["y"], ["yd"], to=T.DOUBLE),
             h.make_node("Cast", ["yd"], ["y2"], to=T.FLOAT), h.make_node("ReduceSum", ["y2"], ["s"], keepdims=0),
             h.make_node("Greater", ["s", "s"], ["cond"]),
             h.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=branch)]
    g = h.make_graph(nodes, "warm", [h.make_tensor_value_info("x", T.FLOAT, [4])],
                     [h.make_tensor_value_info("out", T.FLOAT, [4])], [c])
    fold(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))


def _measure_here(spec: str, inplace: bool) -> None:
    from trtforge.build_engine.passes import fold

    _warm_up()
    model = _load(spec)
    size = len(model.SerializeToString())  # type: ignore[attr-defined]
    nodes = len(model.graph.node)  # type: ignore[attr-defined]
    import gc

    from trtforge.build_engine.core.heap import release_free_heap

    gc.collect()
    release_free_heap()  # building the model in Python left freed C heap: the fold's trims would hand it back and
    # read as negative growth (as if the fold needed less than it does), so the baseline is live memory only
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")
    before = _status_kb("VmRSS")
    fold(model, inplace=inplace)  # type: ignore[arg-type]
    print(size, nodes, max(0, _status_kb("VmHWM") - before) * 1024)  # 0: never above the RSS before


def _peak_growth(fn: object) -> int:
    """Bytes the resident set grew to above live memory while ``fn()`` ran (freed C heap trimmed first)."""
    import gc

    from trtforge.build_engine.core.heap import release_free_heap

    gc.collect()
    release_free_heap()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")
    before = _status_kb("VmRSS")
    fn()  # type: ignore[operator]
    return max(0, _status_kb("VmHWM") - before) * 1024


def _validation_here(spec: str) -> None:
    """What fold's validation alone costs on this model: onnx's C++ checker and strict shape inference, each on the
    folded model's weight-free skeleton (what ``pipeline._validate`` runs), as RSS growth; printed beside the input's
    serialized size."""
    import onnx

    from trtforge.build_engine.core import onnx_skeleton
    from trtforge.build_engine.passes import fold

    _warm_up()
    model = _load(spec)
    size = len(model.SerializeToString())  # type: ignore[attr-defined]
    data = onnx_skeleton.skeleton_bytes(fold(model, inplace=True, validate=False).model)  # type: ignore[arg-type]
    del model
    checker = _peak_growth(lambda: onnx.checker.check_model(data))
    strict = _peak_growth(lambda: onnx.shape_inference.C.infer_shapes(data, True, True, False))
    print(size, checker, strict)


def _measure(spec: str, inplace: bool) -> tuple[int, int, int]:
    cmd = [sys.executable, "-P", __file__, "--one", spec] + (["--inplace"] if inplace else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
    return int(out[-3]), int(out[-2]), int(out[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a third of the corpus, two weight densities")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--inplace", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--validation", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        _measure_here(args.one, args.inplace)
        return
    if args.validation:
        _validation_here(args.validation)
        return
    import fold_models as fm

    corpus = [f"corpus:{m}/{p}/{e}" for m in fm.MODELS for p in PRECISIONS for e in EXPORTERS]
    dens = (64, 4096) if args.quick else (64, 256, 512, 1024, 4096)
    specs = (corpus[::3] if args.quick else corpus) + ["synthetic:100000"] + [f"weighted:50000,{w}" for w in dens]
    print("| model | nodes | serialized MB | bytes/node | RSS growth MB, fold(model) (x) | in place (x) |")
    print("|---|---:|---:|---:|---:|---:|")
    worst: dict[str, float] = {}
    for spec in specs:
        try:
            size, nodes, grow = _measure(spec, False)
            _, _, grow_in = _measure(spec, True)
        except subprocess.CalledProcessError as exc:
            print(f"| {spec} | failed: {exc.stderr.strip().splitlines()[-1][:100]} | | | | |")
            continue
        print(f"| {spec} | {nodes:,} | {size / 1e6:.2f} | {size / nodes:,.0f} | {grow / 1e6:.1f} "
              f"({grow / size:.2f}x) | {grow_in / 1e6:.1f} ({grow_in / size:.2f}x) |", flush=True)
        kind = spec.split(":")[0] if not spec.startswith("weighted") else spec
        worst[kind] = max(worst.get(kind, 0.0), grow / size)
    for kind, ratio in worst.items():
        print(f"- {kind}: worst fold(model) RSS growth {ratio:.2f}x serialized: "
              f"{'PASS' if ratio < TARGET else 'MISS'} (target < {TARGET:g}x)")
    for spec in ("synthetic:100000", f"weighted:50000,{dens[-2]}"):
        cmd = [sys.executable, "-P", __file__, "--validation", spec]
        size, checker, strict = map(int, subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split())
        print(f"- validation alone on {spec} (the folded skeleton): onnx.checker {checker / 1e6:.1f} MB "
              f"({checker / size:.2f}x the input), strict shape inference {strict / 1e6:.1f} MB ({strict / size:.2f}x)")


if __name__ == "__main__":
    main()
