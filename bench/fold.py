"""Benchmark ``trtforge fold`` against onnxslim, onnx-simplifier and Polygraphy's constant folding.

    pip install -e '.[bench]'            # torch==2.13.0, onnxscript, onnxslim, onnxsim
    python bench/fold.py [--quick] [--results bench/RESULTS.md]

Corpus: DistilBERT-like, MiniLM-like and Llama-like models written in plain torch (bench/fold_models.py), each in
fp32, fp16 and fp16 autocast, exported with the dynamo exporter (with and without its optimizer) and the
TorchScript exporter. For every model and tool it prints Casts+Identities removed, whether every output stayed
bit-identical (onnx.reference for fp16 models, onnxruntime with graph optimizations off for fp32 ones; NaN == NaN)
and seconds; then the median time ratio trtforge / onnx-simplifier, and the synthetic-graph scaling check.
Tools that are not installed are reported as such and skipped.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trtforge.build_engine.passes import fold  # noqa: E402
from trtforge.build_engine.passes.pipeline import op_histogram  # noqa: E402
from trtforge.build_engine.verify.bitwise import run_model, uses_low_precision  # noqa: E402
from trtforge.build_engine.verify.compare import compare_arrays  # noqa: E402
from trtforge.build_engine.verify.inputs import random_feeds  # noqa: E402

MODELS = ["distilbert", "minilm", "llama"]
PRECISIONS = ["fp32", "fp16", "fp16-autocast"]
EXPORTERS = ["dynamo", "dynamo-optimize", "torchscript"]


def _ci(model: onnx.ModelProto) -> int:
    h = op_histogram(model)
    return h["Cast"] + h["Identity"]


def _tools() -> dict[str, Callable[[onnx.ModelProto], onnx.ModelProto] | str]:
    tools: dict[str, Callable[[onnx.ModelProto], onnx.ModelProto] | str] = {"trtforge": lambda m: fold(m).model}
    try:
        import onnxslim

        tools["onnxslim"] = lambda m: onnxslim.slim(m)
    except Exception as exc:  # not installed / broken wheel
        tools["onnxslim"] = f"unavailable ({type(exc).__name__})"
    try:
        import onnxsim

        tools["onnxsim"] = lambda m: onnxsim.simplify(m, check_n=0)[0]
    except Exception as exc:
        tools["onnxsim"] = f"unavailable ({type(exc).__name__}: no wheel for this Python?)"
    try:
        from polygraphy.backend.onnx import fold_constants

        def _poly(m: onnx.ModelProto) -> onnx.ModelProto:
            # what `polygraphy surgeon sanitize --fold-constants` runs (API call, no process start-up)
            return fold_constants(m, copy=True, error_ok=False)

        tools["polygraphy"] = _poly
    except Exception as exc:
        tools["polygraphy"] = f"unavailable ({type(exc).__name__})"
    return tools


def _exact(original: onnx.ModelProto, other: onnx.ModelProto, seed: int = 0) -> str:
    runtime = "onnx.reference" if uses_low_precision(original) else "onnxruntime"
    try:
        feeds = random_feeds(original, seed)
        with np.errstate(all="ignore"):
            a = run_model(original, feeds, runtime)
            b = run_model(other, feeds, runtime)
    except Exception as exc:
        return f"error ({type(exc).__name__})"
    if len(a) != len(b):
        return "no (outputs)"
    worst = 0.0
    ok = True
    for x, y in zip(a, b, strict=True):
        d = compare_arrays(x, y)
        ok &= d.bitwise
        worst = max(worst, d.max_abs_unequal)
    return "yes" if ok else f"NO ({worst:.2g})"


def run_corpus(quick: bool) -> tuple[list[dict], list[str]]:
    import fold_models as fm

    tools = _tools()
    notes = [f"{name}: {t}" for name, t in tools.items() if isinstance(t, str)]
    rows: list[dict] = []
    combos = [(m, p, e) for m in MODELS for p in PRECISIONS for e in EXPORTERS]
    if quick:
        combos = combos[::4]
    for name, prec, exp in combos:
        label = f"{name}/{prec}/{exp}"
        try:
            model = fm.export(name, prec, exp)
        except Exception as exc:
            notes.append(f"{label}: export failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
            continue
        row: dict = {"model": label, "nodes": sum(op_histogram(model).values()), "ci": _ci(model)}
        for tool, fn in tools.items():
            if isinstance(fn, str):
                continue
            src = onnx.ModelProto()
            src.CopyFrom(model)
            t0 = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = fn(src)
            except Exception as exc:
                row[tool] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"}
                continue
            sec = time.perf_counter() - t0
            row[tool] = {"removed": row["ci"] - _ci(out), "exact": _exact(model, out), "seconds": sec,
                         "nodes": sum(op_histogram(out).values())}
        rows.append(row)
        _print_row(row, tools)
    return rows, notes


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if "error" in r:
        return f"error: {r['error'][:40]}"
    return f"{r['removed']} / {r['exact']} / {r['seconds']:.2f}s"


def _print_row(row: dict, tools: dict) -> None:
    cells = " | ".join(_cell(row.get(t)) for t in tools if not isinstance(tools[t], str))
    print(f"{row['model']:<40} {row['nodes']:>5} {row['ci']:>4} | {cells}", flush=True)


def scaling(sizes: tuple[int, ...] = (50_000, 100_000, 200_000)) -> list[str]:
    """The scale table and its PASS/MISS lines (``fold_scale.py``: sizes alternated, median CPU time, memory)."""
    from fold_scale import run

    lines = run(list(sizes), reps=3)
    print("\n".join(lines), flush=True)
    return lines


def _same(x: object, y: object) -> bool:
    """Bitwise equality (NaN == NaN) of two outputs: tensors, or sequences / optionals of them."""
    if isinstance(x, (list, tuple)) or isinstance(y, (list, tuple)):
        return (isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y)
                and all(_same(p, q) for p, q in zip(x, y, strict=True)))
    if x is None or y is None:
        return x is y
    return compare_arrays(np.asarray(x), np.asarray(y)).bitwise


def node_tests(limit: int | None = None) -> dict[str, int | list[str]]:
    """Every ONNX backend node test, regenerated from the installed onnx's case code (nothing downloaded), folded
    and checked bit-exact under onnx.reference on the test's own inputs and on every value class of each dtype."""
    from onnx.backend.test.case.node import collect_testcases
    from onnx.reference import ReferenceEvaluator

    from trtforge.build_engine.verify.fold_feeds import extreme_inputs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in collect_testcases() if c.model is not None][:limit]
    counts: dict[str, int | list[str]] = {"cases": len(cases), "changed": 0, "exact": 0, "differ": 0,
                                          "fold refused": 0, "not runnable": 0, "differing": []}
    for c in cases:
        try:
            res = fold(c.model)
        except Exception:
            counts["fold refused"] += 1  # type: ignore[operator]
            continue
        if res.model.SerializeToString() == c.model.SerializeToString() or not res.report.rules:
            continue
        counts["changed"] += 1  # type: ignore[operator]
        names = [i.name for i in c.model.graph.input]
        # a case whose dtype numpy lacks (float8, int4, ...) stores its inputs as TensorProtos
        feeds_list = [dict(zip(names, [_array(v) for v in ins], strict=False)) for ins, _ in (c.data_sets or [])]
        try:
            first = feeds_list[0] if feeds_list else random_feeds(c.model, 0)
            shapes = {k: list(v.shape) for k, v in first.items()}
            extreme = extreme_inputs(c.model, shapes, seed=0)
            # integer inputs of node tests are mostly indices/shapes/axes: keep the test's own values for those
            feeds_list.append({k: (v if v.dtype.kind in "iu" else extreme.get(k, v)) for k, v in first.items()})
        except Exception:
            pass
        verdict = "not runnable"
        for feeds in feeds_list:
            try:
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    a = ReferenceEvaluator(c.model).run(None, feeds)
            except Exception:
                continue
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                b = ReferenceEvaluator(res.model).run(None, feeds)
            same = all(_same(x, y) for x, y in zip(a, b, strict=True))
            verdict = "exact" if same and verdict != "differ" else "differ"
        counts[verdict] += 1  # type: ignore[operator]
        if verdict == "differ":
            counts["differing"].append(c.name)  # type: ignore[union-attr]
    print(f"ONNX node tests: {counts}", flush=True)
    return counts


def _array(value: object) -> object:
    """A node test's input as onnx.reference takes it: a TensorProto (dtypes numpy lacks) as its array."""
    import onnx

    return onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def markdown(rows: list[dict], notes: list[str], scale: list[str],
             tool_names: list[str], nodes: dict | None = None) -> str:
    lines = [f"## trtforge fold vs onnxslim / onnx-simplifier / polygraphy ({datetime.date(2026, 12, 1)}, "
             "machine: 2-core x86-64 VM, no GPU)", "",
             "Cell: Cast+Identity removed / outputs bit-identical on random inputs / seconds. `ci` = Casts+Identities "
             "in the export. Exactness judged with onnx.reference (fp16 models) or onnxruntime with optimizations "
             "off (fp32).", "",
             "| model/precision/exporter | nodes | ci | " + " | ".join(tool_names) + " |",
             "|---|---:|---:|" + "---|" * len(tool_names)]
    for r in rows:
        lines.append(f"| {r['model']} | {r['nodes']} | {r['ci']} | " + " | ".join(_cell(r.get(t)) for t in tool_names)
                     + " |")
    lines.append("")
    lines += _summary(rows, tool_names)
    lines.append("")
    lines += scale
    if nodes:
        lines.append("")
        lines.append(f"ONNX backend node tests (regenerated from the installed onnx's case code): {nodes['cases']} "
                     f"cases; fold changed {nodes['changed']}; of those, bit-exact under onnx.reference on the "
                     f"test inputs and every value class: {nodes['exact']}, differ: {nodes['differ']} "
                     f"{nodes['differing']}, not runnable by onnx.reference: {nodes['not runnable']}; "
                     f"fold refused (raised): {nodes['fold refused']}")
    if notes:
        lines.append("")
        lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _summary(rows: list[dict], tool_names: list[str]) -> list[str]:
    out = []
    ok = [r for r in rows if "removed" in r.get("trtforge", {})]
    others = [t for t in tool_names if t != "trtforge"]
    beat = 0
    misses = []
    for r in ok:
        best = max((r[t]["removed"] for t in others if "removed" in r.get(t, {})), default=0)
        if r["trtforge"]["removed"] >= best:
            beat += 1
        else:
            misses.append(f"{r['model']} ({r['trtforge']['removed']} < {best})")
    exact = sum(r["trtforge"]["exact"] == "yes" for r in ok)
    out.append(f"- trtforge removes at least as many Cast+Identity as the best other tool on {beat}/{len(ok)} models"
               + (f"; fewer on: {', '.join(misses)}" if misses else ""))
    out.append(f"- trtforge outputs bit-identical on {exact}/{len(ok)} models")
    for t in others:
        ex = [r for r in ok if "removed" in r.get(t, {})]
        n_exact = sum(r[t]["exact"] == "yes" for r in ex)
        out.append(f"- {t}: bit-identical on {n_exact}/{len(ex)} models it processed")
    if any("removed" in r.get("onnxsim", {}) for r in ok):
        ratios = [r["trtforge"]["seconds"] / r["onnxsim"]["seconds"] for r in ok if "removed" in r.get("onnxsim", {})]
        out.append(f"- time trtforge / onnx-simplifier: median {statistics.median(ratios):.2f}x "
                   f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
    for t in tool_names:
        secs = [r[t]["seconds"] for r in ok if "removed" in r.get(t, {})]
        if secs:
            out.append(f"- {t}: median {statistics.median(secs):.3f} s per model")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every 4th model only")
    ap.add_argument("--results", type=Path, help="append the markdown table to this file (e.g. bench/RESULTS.md)")
    ap.add_argument("--only", choices=["corpus", "nodes", "scaling"], help="run one part only")
    args = ap.parse_args()
    tools = [t for t, f in _tools().items() if not isinstance(f, str)]
    rows: list[dict] = []
    notes: list[str] = []
    if args.only in (None, "corpus"):
        print(f"{'model/precision/exporter':<40} {'nodes':>5} {'ci':>4} | " + " | ".join(tools)
              + "   (cell: removed / exact / seconds)")
        rows, notes = run_corpus(args.quick)
    nodes = node_tests(200 if args.quick else None) if args.only in (None, "nodes") else None
    scale = scaling((25_000, 50_000) if args.quick else (50_000, 100_000, 200_000)) if args.only in (
        None, "scaling") else []
    md = markdown(rows, notes, scale, tools, nodes)
    print()
    print(md)
    if args.results:
        with open(args.results, "a", encoding="utf-8") as fh:
            fh.write("\n" + md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
