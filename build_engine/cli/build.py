"""``trtforge build IN.onnx --profile NAME -o OUTDIR [--backend auto|tensorrt|tensorrt-rtx] [--force]
[--dim NAME=MIN:OPT:MAX ...]``."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._common import make_parser, run_command

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.manifest import ShapeRange


def build_parser() -> ArgumentParser:
    p = make_parser(
        "trtforge build",
        "Build a TensorRT engine for a GPU profile: precision from the profile, fold, parse, optimization profiles "
        "from the profile's shape ranges; writes OUTDIR/model.plan, OUTDIR/manifest.json and OUTDIR/model.onnx.",
    )
    p.add_argument("input", help="input .onnx model")
    p.add_argument("--profile", required=True, help="GPU profile name (a10, a100, l40s, h100) or path to a .toml")
    p.add_argument("-o", "--output", required=True, help="output folder (must not exist unless --force)")
    p.add_argument("--backend", default="auto", choices=["auto", "tensorrt", "tensorrt-rtx"],
                   help="TensorRT flavour (auto: full TensorRT if it can target the GPU, else TensorRT-RTX)")
    p.add_argument("--force", action="store_true", help="replace OUTDIR if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=MIN:OPT:MAX",
                   help="range of a named dynamic dimension other than batch/sequence (its dim_param), in every "
                        "optimization profile, e.g. --dim num_patches=1:64:256 (repeatable; batch and sequence "
                        "ranges come from the profile)")
    return p


def _run(args: Any) -> int:
    from ..engine.builder import build_engine
    from ._outputs import check_outputs, if_exists

    # -o is replaced as a whole (with --force): it must not be or hold the model, its data or the profile, and a
    # rename must be able to replace it (not '.', not a mount point).
    check_outputs(inputs=[("IN.onnx", args.input), ("--profile", if_exists(args.profile))],
                  folders=[("-o", args.output)])
    from ..engine.shapes import parse_dims

    dims = parse_dims(args.dim)
    m = build_engine(args.input, args.profile, args.output, backend=args.backend, force=args.force,
                     progress=not args.no_progress, dims=dims)
    ins = ", ".join(f"{i.name} {i.dtype} {_range(i.envelope)}" for i in m.inputs)
    print(f"{args.output}: {m.backend.name} {m.backend.version} engine for {m.profile} "
          f"(sm {', '.join(m.compute_capabilities)}, {m.precision}, {m.optimization_profiles} optimization "
          f"profiles; inputs {ins}) in {m.build_seconds:.2f} s")
    return 0


def _range(r: ShapeRange | None) -> str:
    return "static" if r is None else f"{list(r.min)}..{list(r.max)}"


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
