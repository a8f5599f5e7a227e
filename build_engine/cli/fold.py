"""``trtforge fold IN.onnx -o OUT.onnx [--report R.json] [--check]``: exact Cast/Identity folding.

Exit codes: 0 folded (and, with ``--check``, outputs proven bit-identical on random inputs); 1 ``--check`` found a
differing output (the model is then NOT written; the report is, with ``check.passed: false``); 2 bad input (not
ONNX, truncated, missing or escaping external data, cycle, dangling input, unwritable output) with one line.
External data in means external data out (``OUT.onnx.data`` beside the output).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import ArgumentParser, add_file_force, make_parser, run_command, stdout_console
from ._outputs import check_outputs


def build_parser() -> ArgumentParser:
    p = make_parser("trtforge fold", "Exact folding, never changing an output bit (a NaN stays a NaN of its sign; "
                                     "its payload and quiet bit, where runtimes differ themselves, may change: a "
                                     "removed float16 -> float32 -> float16 round trip no longer quiets a "
                                     "signalling NaN). It turns a CastLike whose "
                                     "target's type is known into the Cast it denotes, then removes: "
                                     "Cast and Identity nodes that are no-ops or exact round trips, shortens exact "
                                     "Cast chains (also across data-movement ops: Reshape, Transpose, Gather, "
                                     "...), merges duplicate Casts of one value, lets Shape/Size read a Cast's "
                                     "input and Gather/GatherElements read the int32 indices an int32->int64 Cast "
                                     "widens (the Cast goes unless it has other readers), replaces a Cast of a "
                                     "constant (and the constant expression feeding it, when every op in it is "
                                     "exactly specified) by the constant it computes, and removes nodes of ANY ONNX "
                                     "op whose outputs nothing reads (dead Constant, Shape, Concat, RandomNormal, "
                                     "... nodes) and unread initializers (not those training_info reads or "
                                     "updates, nor values a quantization_annotation names); nodes of other "
                                     "domains (ai.onnx.ml, com.microsoft, plugins, model-local functions) are kept, "
                                     "read or not, and so is an unread If/Loop/Scan whose body holds one. The "
                                     "summary and --report count removed nodes per op type.")
    p.add_argument("input", help="input .onnx model")
    p.add_argument("-o", "--output", required=True, help="output .onnx model (written atomically)")
    p.add_argument("--report", help="write the fold report (JSON) here")
    add_file_force(p)
    p.add_argument("--check", action="store_true",
                   help="run both models on the same seeded inputs (typical values, then every value class of each "
                        "dtype: +-0, +-inf, NaN, extremes, subnormals, precision edges; Loop bodies run, If "
                        "conditions both ways) with onnx.reference, or onnxruntime with optimizations off where "
                        "onnx.reference cannot run the model (or calls function overloads, which onnx.reference "
                        "does not tell apart); fail (exit 1) unless every output is bit-identical (a NaN matching a "
                        "NaN of the same sign); "
                        "exit 2 'could not check this model' naming the op when neither runtime runs it (or naming "
                        "the input that is not a tensor or has over 2**28 elements, or the Loop with a constant "
                        "trip count over 10,000), and when the original's own outputs differ between two runs on "
                        "the same inputs (a random op without a seed)")
    p.add_argument("--seed", type=int, default=0, help="seed for --check's random inputs (default 0)")
    return p


def _summary(report: dict[str, Any], output: str, written: bool) -> None:
    from rich.markup import escape  # the path and op types are the user's: '[bold]' in them prints as written

    console = stdout_console()
    removed = escape(", ".join(f"{op} {n}" for op, n in report["removed"].items())) or "nothing"
    rules = ", ".join(f"{r} {n}" for r, n in report["rules"].items()) or "none fired"
    from ..core import steps

    console.print(f"[bold]{escape(output)}[/bold]: {report['nodes_before']} -> {report['nodes_after']} nodes "
                  f"in {steps.elapsed():.2f} s (load, fold{', check' if 'check' in report else ''} and save; the "
                  f"fold pass {report['seconds']:.3f} s)" + ("" if written else " [red](not written)[/red]"))
    console.print(f"  removed: {removed}")
    if report["added"]:  # the constants folded Casts became (else before - removed != after)
        console.print("  added:   " + escape(", ".join(f"{op} {n}" for op, n in report["added"].items())))
    console.print(f"  rules:   {rules}")
    check = report.get("check")
    if check is not None:
        verdict = "[green]bit-identical[/green]" if check["passed"] else "[red]OUTPUTS DIFFER[/red]"
        console.print(f"  check:   {verdict} on random inputs ({check['runtime']}, max |diff| "
                      f"{check['max_abs_diff']:g})")


def _run(args: Any) -> int:
    from ..core import fsutil, onnx_io, onnx_save, onnx_skeleton, paths
    from ..core.graph import PROTO_LIMIT
    from ..passes import fold
    from ..verify.bitwise import check_equivalent
    from ._bounds import check_seed

    check_seed(args.seed)
    # Before loading: a bad report path leaves no model behind, and no output may overwrite the input.
    check_outputs(*paths.onnx_output("-o", args.output), ("--report", args.report), inputs=[("IN.onnx", args.input)])
    # Big external weights stay on disk (fold reads no weight's values; the save copies their bytes file to file).
    loaded = onnx_io.load(args.input, lazy=True)
    model, external, source_dir = loaded.model, loaded.external_data, loaded.path.parent
    kept = loaded.external_tensors  # tensors besides the initializers that were external stay external
    weight_bytes = sum(f.stat().st_size for f in loaded.data_files)
    del loaded
    # Weights near protobuf's 2 GiB limit cannot be handed to a runtime in memory (onnx.reference's evaluator and an
    # in-memory onnxruntime session both need the serialised model): onnxruntime (optimizations off, as the
    # fallback judge) then runs both models from their files.
    by_path = bool(args.check and weight_bytes >= PROTO_LIMIT)
    # Without an in-memory check the input is not used again: fold it in place (no copy of the weights).
    reference = onnx_skeleton.weightless(model) if by_path else model
    # Folded as loaded, --check or not (the weights still on disk are not folded): --check judges the model that
    # fold writes without it too. Their bytes are read afterwards, into both models, for the in-memory check.
    result = fold(model, inplace=by_path or not args.check)
    folded, report = result.model, dict(result.report.to_json(), input=str(args.input), output=str(args.output))
    if args.check and not by_path and external:
        from ..core.onnx_io import load_external_in_memory

        for m in (reference, folded):
            load_external_in_memory(m, source_dir)
    del result, model
    passed = True
    if by_path:
        # The folded model is checked from a staged file and only then moved in place. Its weights are dropped
        # before onnxruntime loads both files, so they are not held twice.
        with onnx_save.staged_model(args.output) as staged:
            onnx_save.save_model(folded, staged, external_data=True, source_dir=source_dir, external_tensors=kept)
            folded_view = onnx_skeleton.weightless(folded)
            del folded
            chk = check_equivalent(reference, folded_view, seed=args.seed, runtime="onnxruntime",
                                   paths=(str(args.input), str(staged)))
            report["check"] = chk.as_dict()
            passed = chk.passed
            if passed:
                with fsutil.staged_json(args.report, report, describes=args.output):  # both written, or neither
                    onnx_save.promote_model(staged, args.output)
    else:
        if args.check:
            chk = check_equivalent(reference, folded, seed=args.seed)
            report["check"] = chk.as_dict()
            passed = chk.passed
        if passed:
            with fsutil.staged_json(args.report, report, describes=args.output):  # both written, or neither
                onnx_save.save_model(folded, args.output, external_data=external or None, source_dir=source_dir,
                                     external_tensors=kept)
    if args.report and not passed:  # the report says why no model was written (and that none was)
        fsutil.write_json(args.report, {**report, "output_sha256": None, "output_bytes": None})
    _summary(report, args.output, passed)
    return 0 if passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
