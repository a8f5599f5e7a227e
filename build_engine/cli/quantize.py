"""``trtforge quantize IN.onnx -o OUT.onnx --mode int8|int4-wo|fp8 [--calib SAMPLES.npz] ...``.

Exit codes: 0 written; 2 bad input (not ONNX, already quantized, a bad calibration file naming the input at fault,
bad flags), with nothing written.
"""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Sequence
from typing import Any

from ._common import add_file_force, make_parser, run_command
from ._outputs import check_outputs


def build_parser() -> ArgumentParser:
    p = make_parser(
        "trtforge quantize",
        "Post-training quantization to explicit Q/DQ ONNX that TensorRT strongly typed networks (TensorRT 10+, "
        "TensorRT-RTX) build: int8 = SmoothQuant W8A8 (per-channel int8 weights, per-tensor int8 activations); "
        "int4-wo = int4 weight-only blocks (AWQ-style scale search, or round-to-nearest); fp8 = E4M3 weights per "
        "channel and activations per tensor (builds for compute capability >= 8.9 only). Quantized: MatMuls "
        "whose weight is a 2-D float32 initializer or Constant (not a graph input), or a Transpose of such an "
        "initializer (x @ W.T, a tied LM head), and Gemms of that kind with "
        "alpha = beta = 1 and transA = 0 (written as MatMul + bias Add; other Gemms stay float and are reported). "
        "Norms, softmax, rotary/position arithmetic, shape/index chains (the precision policy), the LM head and LoRA "
        "plugin nodes stay float. NaN/inf weights are refused (exit 2). The result is folded with the exact folder.",
    )
    p.add_argument("input", help="input .onnx model (float32)")
    p.add_argument("-o", "--output", required=True, help="output .onnx model (written atomically)")
    p.add_argument("--mode", required=True, choices=["int8", "int4-wo", "fp8"], help="quantization mode")
    p.add_argument("--calib", help="calibration samples: .npz with one array per graph input, keyed by input name "
                                   "(rank of the input: one sample; rank + 1: samples stacked on axis 0; LoRA slot "
                                   "ids and adapter pools may be left out: no adapter); default: generated from the "
                                   "model")
    p.add_argument("--calib-size", type=int, default=16,
                   help="samples to generate without --calib (default 16; 1 to 4096)")
    p.add_argument("--calib-seq", type=int, default=32,
                   help="sequence length of generated samples (default 32; 1 to 131072, and at most 2**20 tokens "
                        "with --calib-size)")
    p.add_argument("--seed", type=int, default=0, help="seed of generated samples and AWQ row sampling (default 0)")
    p.add_argument("--exclude", default="", help="comma-separated node-name patterns kept in float (fnmatch globs; "
                                                 "a pattern without *?[ matches as a substring whose numbers match "
                                                 "whole, so layers.1 is not layers.10; one that matches no "
                                                 "node name is refused)")
    p.add_argument("--alpha", type=float, default=None,
                   help="SmoothQuant migration strength for int8 (default 0.5); an option the --mode does not read "
                        "(--alpha, --calibrator, --block-size, --int4-method) is named in a warning")
    p.add_argument("--calibrator", default=None, choices=["max", "percentile", "entropy"],
                   help="activation range calibrator for int8/fp8 (default max; percentile and entropy are "
                        "onnxruntime.quantization's)")
    p.add_argument("--block-size", type=int, default=None,
                   help="int4 block along the input dim (default 128; a projection whose input size it does not "
                        "divide uses the largest power of two that does, >= 16)")
    p.add_argument("--int4-method", default=None, choices=["awq", "rtn"],
                   help="int4 scales: awq (activation-aware search) or rtn (round-to-nearest) (default awq)")
    p.add_argument("--quantize-lm-head", action="store_true", help="quantize the LM head too")
    p.add_argument("--report", help="write the quantization report (JSON) here")
    add_file_force(p)
    return p


#: option -> (its default, the modes that read it): given to another mode it is named in a warning, not silently ignored
_MODE_OPTIONS = {"alpha": (0.5, ("int8",)), "calibrator": ("max", ("int8", "fp8")),
                 "block_size": (128, ("int4-wo",)), "int4_method": ("awq", ("int4-wo",))}


def _mode_options(args: Any) -> list[str]:
    """Fill each mode option's default; the options given to a mode that does not read them, as warnings (logged
    after a run that succeeded: an error stays the one line on stderr)."""
    ignored = []
    for name, (default, modes) in _MODE_OPTIONS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
        elif args.mode not in modes:
            ignored.append(f"--{name.replace('_', '-')} applies to --mode {' / '.join(modes)} only; ignored for "
                           f"--mode {args.mode}")
    return ignored


def _run(args: Any) -> int:
    from ..core import fsutil, onnx_io, onnx_save, paths
    from ..quantize import QuantConfig, generate, load_npz, quantize
    from ._bounds import check_seed

    check_seed(args.seed)
    ignored = _mode_options(args)
    check_outputs(*paths.onnx_output("-o", args.output), ("--report", args.report),
                  inputs=[("IN.onnx", args.input), ("--calib", args.calib)])
    cfg = QuantConfig(mode=args.mode, alpha=args.alpha, calibrator=args.calibrator, block_size=args.block_size,
                      int4_method=args.int4_method, calib_size=args.calib_size, seq_len=args.calib_seq,
                      exclude=tuple(p.strip() for p in args.exclude.split(",")) if args.exclude else (),
                      quantize_lm_head=args.quantize_lm_head, seed=args.seed)
    # Big external weights stay on disk: quantize reads each projection's weight when it needs it, calibration runs
    # the model by path, and the weights left float are copied file to file into the output's data.
    loaded = onnx_io.load(args.input, lazy=True)
    source_dir = loaded.path.parent
    calib = (load_npz(args.calib, loaded.model) if args.calib
             else generate(loaded.model, cfg.calib_size, cfg.seq_len, cfg.seed))
    result = quantize(loaded.model, cfg, calib, data_dir=source_dir)
    report = {**result.report.to_json(), "input": str(args.input), "output": str(args.output)}
    with fsutil.staged_json(args.report, report, describes=args.output):  # both written, or neither
        # ``save_like``'s layout, and the weights still on disk (left float) copied from the source's data file
        onnx_save.save_model(result.model, args.output, external_data=loaded.external_data or None,
                             source_dir=source_dir, external_tensors=loaded.external_tensors)
    r = result.report
    print(f"{args.output}: {r.mode}, {len(r.nodes)} projections quantized, {len(r.excluded)} kept in float, "
          f"{r.seconds:.2f} s; calibration: {r.calibration}")
    for e in r.excluded:
        print(f"  float: {e.name} ({e.reason})")
    if ignored:
        from ..core.log import logger

        for text in ignored:
            logger("quantize").warning(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
