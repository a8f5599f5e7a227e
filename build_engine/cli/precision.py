"""``trtforge precision IN.onnx -o OUT.onnx --to fp16|bf16 [--report R.json]``."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Sequence
from typing import Any

from ._common import add_file_force, make_parser, run_command
from ._outputs import check_outputs


def build_parser() -> ArgumentParser:
    p = make_parser(
        "trtforge precision",
        "Convert float32 tensors and initializers to fp16 or bf16, keeping numerically sensitive ops (norms, "
        "softmax, reductions, Pow/Exp/Sqrt, rotary Sin/Cos) in fp32 and the graph's I/O dtypes, then fold Casts.",
    )
    p.add_argument("input", help="input .onnx model")
    p.add_argument("-o", "--output", required=True, help="output .onnx model (written atomically)")
    p.add_argument("--to", required=True, choices=["fp16", "bf16"], help="target precision")
    p.add_argument("--report", help="write the conversion report (JSON) here")
    add_file_force(p)
    p.add_argument("--no-fold", action="store_true", help="skip the fold pipeline after converting")
    return p


def _run(args: Any) -> int:
    from ..core import fsutil, onnx_io, onnx_save, paths
    from ..precision.convert import convert_precision

    # A bad report path leaves no model behind, and no output may overwrite the input.
    check_outputs(*paths.onnx_output("-o", args.output), ("--report", args.report), inputs=[("IN.onnx", args.input)])
    # Big external weights stay on disk: each is converted from its file, and those kept as they are are copied.
    loaded = onnx_io.load(args.input, lazy=True)
    _refuse_plugin_conflicts(loaded.model, args.input, args.to)
    source_dir = loaded.path.parent
    result = convert_precision(loaded.model, args.to, fold=not args.no_fold, data_dir=source_dir)
    external, kept = loaded.external_data, loaded.external_tensors
    del loaded
    with fsutil.staged_json(args.report, result.report.to_json() if args.report else None,  # both or neither
                           describes=args.output):
        onnx_save.save_model(result.model, args.output, external_data=external or None, source_dir=source_dir,
                             external_tensors=kept)
    from ..core import steps

    r = result.report
    folded = r.fold
    print(f"{args.output}: {args.to}, {r.nodes_low} nodes converted, {r.nodes_fp32} kept in fp32 "
          f"({', '.join(f'{k} {v}' for k, v in r.kept_fp32_ops.items()) or 'none'}), "
          f"{r.casts_inserted} Casts inserted"
          + (f", fold {folded.nodes_before} -> {folded.nodes_after} nodes" if folded else "")
          + f"; {steps.elapsed():.2f} s in all (load to save)")
    other = _other_16bit(result.model, args.to)
    if other:  # on stderr as 'note: ...' (logged: --quiet drops notes, as every command's)
        from ..core import log

        log.logger("cli.precision").info(
            "%s already holds %s; conversion rewrites float32 only (16-bit to 16-bit would round twice), so they "
            "stay as they are: convert the fp32 model for an all-%s one", args.input, other, args.to)
    return 0


def _other_16bit(model: Any, to: str) -> str:
    """The initializers of the other 16-bit float type left in ``model``, as text ("" when none)."""
    from onnx import TensorProto

    other, name = (TensorProto.BFLOAT16, "bfloat16") if to == "fp16" else (TensorProto.FLOAT16, "float16")
    n = sum(1 for t in model.graph.initializer if t.data_type == other)
    return f"{n} {name} initializer{'s' if n != 1 else ''}" if n else ""


def _refuse_plugin_conflicts(model: Any, path: str, to: str) -> None:
    """Plugin nodes already in the other 16-bit type: converting leaves them (and their adapter pools) in it.

    Conversion only rewrites float32 tensors (16-bit -> 16-bit would round twice), so a "bf16" model would keep
    float16 adapter pools; refuse and name the order that works (inject into the fp32 model, then convert).
    """
    from trtforge.plugins.lora.precision import dtype_conflicts

    from ..core.errors import InputError
    from ..precision.policy import LOW_TYPES

    found = dtype_conflicts(model, LOW_TYPES[to])
    if found:
        raise InputError(f"{path}: {found[0]}{f' (and {len(found) - 1} more)' if len(found) > 1 else ''}, so --to "
                         f"{to} would leave its adapter pools in that type; run trtforge lora inject on the fp32 "
                         f"model, then trtforge precision --to {to}")


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
