"""``trtforge diff A.onnx B.onnx``: compare two models' outputs through Polygraphy (exit 1 on mismatch).

    trtforge diff A.onnx B.onnx [--precision fp32|fp16|bf16] [--atol X] [--rtol Y] [--seed S]
                  [--shape NAME:D0,D1 ...] [--value NAME=V ...] [--extra-inputs] [--save R.json] [--ort-optimize]

Exit codes: 0 every output within tolerance; 1 some output differs; 2 bad input (missing file, different
input/output names, bad --shape).
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Sequence

from ._common import ArgumentParser, add_file_force, make_parser, run_command, stdout_console


def build_parser() -> ArgumentParser:
    p = make_parser("trtforge diff", "Compare two models' outputs on the same seeded random inputs through "
                                     "Polygraphy's Comparator (onnxruntime runners; plugin nodes are decomposed).")
    p.add_argument("a", metavar="A", help="first model (.onnx; or an engine folder where TensorRT and a GPU exist)")
    p.add_argument("b", metavar="B", help="second model, compared against A (B is the reference for rtol)")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16", "int8", "int4-wo", "fp8"], default="fp32",
                   help="tolerance preset: fp32 1e-5/1e-5, fp16 atol 1e-2 rtol 1e-3, bf16 atol 5e-2 rtol 1e-2; "
                        "quantized A against its fp32 source B, over whole outputs: int8 rel. error <= 0.10 and "
                        "top-1 agreement >= 0.85, fp8 0.15 / 0.80, int4-wo 0.35 / 0.50. Integer outputs (token "
                        "ids) are judged by the same atol/rtol (Polygraphy's rule: ids 5000 vs 5001 pass fp16); "
                        "--atol 0 --rtol 0 compares them exactly")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance (overrides the preset)")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (overrides the preset); "
                                                            "--atol 0 --rtol 0 means bitwise equal")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                   help="concrete shape for an input, e.g. input_ids:2,16 (repeatable)")
    p.add_argument("--value", action="append", default=[], metavar="NAME=V",
                   help="fill an input with one constant, e.g. lora_slot_ids=-1 (repeatable)")
    p.add_argument("--extra-inputs", action="store_true",
                   help="allow inputs only one model has (generated for that model alone), e.g. LoRA pools")
    p.add_argument("--save", "--report", metavar="R.json", dest="save",
                   help="save Polygraphy RunResults JSON (plus R.accuracy.json and R.summary.json beside it); "
                        "standard JSON, where an infinite or NaN number is the string \"inf\", \"-inf\" or "
                        "\"nan\"; --report is the same option, as fold, precision and quantize spell it")
    add_file_force(p)
    p.add_argument("--ort-optimize", action="store_true",
                   help="let onnxruntime optimize the graphs and prepack weights (off by default: then every op runs "
                        "as written, so equivalent graphs give bitwise equal outputs; onnxruntime 1.32's CPU "
                        "optimizations compute fp8 Q/DQ MatMuls wrong, so leave it off for fp8 models)")
    return p


def _run(args: Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from ..verify.diff import check, run_diff, save_paths, save_results
    from ..verify.inputs import parse_shape_args, parse_value_args
    from ._bounds import check_seed

    check_seed(args.seed)
    if args.save is not None:  # ('' too) before comparing: a bad --save fails fast, cannot overwrite a model
        save_paths(args.save, (args.a, args.b))
    result = run_diff(args.a, args.b, precision=args.precision, atol=args.atol, rtol=args.rtol, seed=args.seed,
                      shapes=parse_shape_args(args.shape), values=parse_value_args(args.value),
                      extra_inputs=args.extra_inputs, ort_optimize=args.ort_optimize)
    # every name below comes from the user's files: escaped, so '[/x]' prints as written instead of raising
    title = escape(f"{args.a} vs {args.b}") + f" (atol={result.atol:g}, rtol={result.rtol:g}, seed={result.seed})"
    table = Table(title=title)
    for col in ("output", "max abs", "max rel", "rel to scale", "rel error", "top-1", "mismatches", "pass"):
        table.add_column(col, justify="left" if col == "output" else "right")
    for o in result.outputs:
        table.add_row(escape(o.name), f"{o.max_abs:.3g}", f"{o.max_rel:.3g}", f"{o.rel_to_scale:.3g}",
                      f"{o.rel_error:.3g}", "-" if o.top1 is None else f"{o.top1:.3f}",
                      f"{o.mismatches}/{o.total}",
                      "[green]yes[/green]" if o.passed else "[red]NO[/red]")
    console = stdout_console()
    if result.decomposed:
        console.print(f"decomposed plugin nodes of {escape(', '.join(result.decomposed))} before running")
    console.print(table)
    for o in result.outputs:  # one plain line per output for scripts and the demo summary
        if o.top1 is not None and args.precision in ("int8", "int4-wo", "fp8"):
            console.print(f"accuracy {escape(o.name)}: top-1 agreement {o.top1:.3f}, relative error {o.rel_error:.4f}")
    if args.save is not None:
        saved = save_results(result, args.save)
        console.print("saved " + escape(", ".join(str(p) for p in saved)))
    check(result)
    from ..core import steps

    console.print(f"[green]outputs match[/green] ({steps.elapsed():.2f} s in all: load, run, compare)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
