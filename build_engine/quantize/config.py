"""What ``trtforge quantize`` is asked to do: one frozen, validated configuration (no untyped dicts cross modules)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import InputError
from ..engine.quantized import METADATA_KEY  # the engine reads the entry, so it owns the name

__all__ = ["CALIBRATORS", "INT4_METHODS", "METADATA_KEY", "MIN_BLOCK", "MIN_IR", "MIN_OPSET", "MODES",
           "QuantConfig"]

MODES: tuple[str, ...] = ("int8", "int4-wo", "fp8")
CALIBRATORS: tuple[str, ...] = ("max", "percentile", "entropy")
INT4_METHODS: tuple[str, ...] = ("awq", "rtn")
# Default-domain opset and IR version each mode needs: FP8 types in Q/DQ arrived in opset 19 (IR 9), INT4 and
# DequantizeLinear's block_size in opset 21 (IR 10).
MIN_OPSET = {"int8": 13, "fp8": 19, "int4-wo": 21}
MIN_IR = {"int8": 7, "fp8": 9, "int4-wo": 10}
MIN_BLOCK = 16  # the smallest int4 block a projection is given (``quantizer.block_for``)


#: Bounds of generated calibration data: ``--calib-size 10**8`` grew to gigabytes and never ended, ``--calib-seq
#: 10**9`` was a MemoryError (exit 3).
MAX_CALIB_SIZE = 4096
MAX_CALIB_SEQ = 131072
MAX_CALIB_TOKENS = 2**20


@dataclass(frozen=True)
class QuantConfig:
    """``alpha``: SmoothQuant migration strength (int8); ``block_size``: INT4 block along the input dim;
    ``calib_size``: samples generated when no file is given (a file's samples are all used); ``seq_len``: the
    sequence length of generated samples; ``exclude``: node-name patterns (fnmatch globs; a pattern without
    ``*?[`` matches as a substring, its numbers whole) kept in float."""

    mode: str
    alpha: float = 0.5
    calibrator: str = "max"
    block_size: int = 128
    int4_method: str = "awq"
    calib_size: int = 16
    seq_len: int = 32
    exclude: tuple[str, ...] = ()
    quantize_lm_head: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError(f"--mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if self.calibrator not in CALIBRATORS:
            raise InputError(f"--calibrator {self.calibrator!r}: choose one of {', '.join(CALIBRATORS)}")
        if self.int4_method not in INT4_METHODS:
            raise InputError(f"--int4-method {self.int4_method!r}: choose one of {', '.join(INT4_METHODS)}")
        if not 0.0 <= self.alpha <= 1.0:
            raise InputError(f"--alpha {self.alpha}: SmoothQuant's migration strength lies in [0, 1] (default 0.5)")
        if self.block_size < MIN_BLOCK or self.block_size & (self.block_size - 1):
            raise InputError(f"--block-size {self.block_size}: use a power of two >= {MIN_BLOCK} (default 128; "
                             f"smaller int4 blocks are never used, see --help)")
        if not 1 <= self.calib_size <= MAX_CALIB_SIZE:
            raise InputError(f"--calib-size {self.calib_size}: give a whole number from 1 to {MAX_CALIB_SIZE} "
                             "(generated calibration samples; for more, pass your own with --calib)")
        if not 1 <= self.seq_len <= MAX_CALIB_SEQ:
            raise InputError(f"--calib-seq {self.seq_len}: give a whole number from 1 to {MAX_CALIB_SEQ}")
        if self.calib_size * self.seq_len > MAX_CALIB_TOKENS:  # each sample is held in memory and run in onnxruntime
            raise InputError(f"--calib-size {self.calib_size} x --calib-seq {self.seq_len}: at most "
                             f"{MAX_CALIB_TOKENS:,} generated tokens in all (e.g. 512 x 2048); lower either, or pass "
                             "samples with --calib")
        if any(not p.strip() for p in self.exclude):
            raise InputError("--exclude has an empty pattern; give comma-separated node-name patterns")
