"""Which float32 constants an fp16 conversion may not clip: those holding a finite value beyond +-65504 (precision
policy rule 8: their consumers stay fp32, as clipping ``x * 1e5`` to 65504 would change the result), and small ones
it would round to zero (rule 10: an epsilon of 1e-12 added in fp16 adds nothing), and exponents not proven
non-negative (rule 3: ``x * Pow(mean(x^2) + eps, -0.5)`` is ``x / rms``, whose 1 / rms is beyond fp16 for a
near-zero row).

A weight still on disk (lazy loading of external data) is read from its file in chunks when the caller gives its
folder (``data_dir``); without it such a weight cannot be read and is not judged (``onnx_io.load`` without ``lazy``
holds every weight in memory). A padding mask of ``finfo.min`` big enough to stay on disk is the case this covers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import ModelProto, TensorProto, numpy_helper

_FP16_MAX = float(np.finfo(np.float16).max)
FLOAT = TensorProto.FLOAT
#: The constant types rule 8 reads, with their little-endian numpy dtype (for weights still on disk).
_WIDE_TYPES: dict[int, str] = {FLOAT: "<f4", TensorProto.DOUBLE: "<f8"}


def beyond_fp16(consts: dict[str, TensorProto], to: str, data_dir: Path | None = None) -> frozenset[str]:
    """float32 (and float64: a double literal the model casts to float32) constants with a finite value beyond
    +-65504 (for fp16 only): clipping them would change the result, so their consumers stay fp32 (policy rule 8).
    ``data_dir``: the folder of a lazily loaded model, whose weights still on disk are read from there, in chunks."""
    if to != "fp16":
        return frozenset()
    out: set[str] = set()
    for name, t in consts.items():
        if t.data_type not in _WIDE_TYPES:
            continue
        if t.data_location == TensorProto.EXTERNAL:
            if data_dir is not None and _on_disk_beyond_fp16(t, data_dir):
                out.add(name)
        elif holds_beyond_fp16(numpy_helper.to_array(t).reshape(-1)):
            out.add(name)
    return frozenset(out)


#: Elements of a constant judged by ``vanish_in_fp16``: epsilons are scalars or short vectors; a weight matrix is not
#: read a second time for it (one all-tiny weight is not what this rule is for).
_TINY_MAX_ELEMENTS = 4096


def vanish_in_fp16(consts: dict[str, TensorProto], to: str) -> frozenset[str]:
    """Small float32 / float64 constants (in memory, at most ``_TINY_MAX_ELEMENTS``; a double literal the model casts
    to float counts) with a nonzero value, every nonzero value of which fp16 rounds to zero (below 2**-25: an epsilon
    of 1e-8 or 1e-12): policy rule 10 keeps their readers fp32."""
    if to != "fp16":
        return frozenset()
    out: set[str] = set()
    for name, t in consts.items():
        small = 0 < _elements(t) <= _TINY_MAX_ELEMENTS
        if t.data_type not in (FLOAT, TensorProto.DOUBLE) or t.data_location == TensorProto.EXTERNAL or not small:
            continue
        flat = numpy_helper.to_array(t).reshape(-1)
        nonzero = flat[(flat != 0) & np.isfinite(flat)]
        with np.errstate(over="ignore"):  # a value beyond fp16 (a mask's finfo.min) casts to inf: not zero, no warning
            low = nonzero.astype(np.float16)
        if nonzero.size and not np.any(low != 0):
            out.add(name)
    return frozenset(out)


def negative_exponents(model: ModelProto, consts: dict[str, TensorProto], to: str) -> frozenset[str]:
    """The exponents of the main graph's ``Pow`` nodes not proven non-negative, for fp16 only: ``Pow(d, e)`` of a
    negative ``e`` is a reciprocal (``Pow(var + eps, -0.5)`` is ``rsqrt``), so policy rule 3 keeps a ``Mul`` by it in
    fp32 as it does a ``Mul`` by ``Reciprocal(d)``. Proven means: every value of ``e`` is known and none is below
    zero. ``e`` is known when it is a constant held in memory (``consts``: initializer, Constant, Identity of one) or
    computed from constants by ops whose result is exact (``passes.const_expr.constant_values``: ``Cast``, ``Neg``,
    ``Reshape``, ``Unsqueeze``, ``ConstantOfShape``, ``Sub``, ...), evaluated as the runtime will. Any other
    exponent (a graph input, an op that is not exact such as ``Exp``, a weight still on disk, an expression too
    large to evaluate) may be negative, so it counts as one: a Mul kept fp32 costs speed, a reciprocal beyond
    +-65504 multiplied in fp16 gives inf."""
    if to != "fp16":
        return frozenset()
    exponents = {n.input[1] for n in model.graph.node if n.op_type == "Pow" and n.domain in ("", "ai.onnx")
                 and len(n.input) > 1 and n.input[1]}
    values: dict[str, np.ndarray | None] = {}
    for name in exponents:
        t = consts.get(name)
        if t is not None and t.data_location != TensorProto.EXTERNAL:
            values[name] = numpy_helper.to_array(t)
    computed = exponents - set(values) - {n for n in exponents if n in consts}
    if computed:
        from ..passes.const_expr import constant_values

        values.update(constant_values(model, sorted(computed)))
    return frozenset(n for n in exponents if not _non_negative(values.get(n)))


def _non_negative(value: np.ndarray | None) -> bool:
    """Whether ``value`` is known and holds no value below zero (NaN is no negative: ``Pow(d, nan)`` is NaN in every
    precision; ml_dtypes' bfloat16 is numpy kind 'V', so compare in float64)."""
    if value is None or value.dtype.kind not in "fiuV":
        return False
    return not bool(np.any(value.astype(np.float64) < 0))


def _elements(t: TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def _on_disk_beyond_fp16(tensor: TensorProto, data_dir: Path) -> bool:
    from ..core.lazy_weights import read_chunks

    dtype = _WIDE_TYPES[tensor.data_type]
    return any(holds_beyond_fp16(part) for part in read_chunks(tensor, data_dir, dtype, 1 << 20))


def holds_beyond_fp16(flat: np.ndarray, chunk: int = 1 << 20) -> bool:
    """Whether a finite value beyond +-65504 is in ``flat``, read in chunks (a weight of hundreds of MB would
    otherwise need three temporaries of its size: the mask, the finite values and their magnitudes)."""
    for i in range(0, flat.size, chunk):
        c = np.abs(flat[i:i + chunk])
        if bool(np.any((c > _FP16_MAX) & np.isfinite(c))):
            return True
    return False
