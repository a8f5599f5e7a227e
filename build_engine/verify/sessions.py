"""The one onnxruntime session factory of trtforge (``fold --check``, ``diff``, quantization's calibration runs).

A deterministic session runs each op as written, in the same order, every time:

- graph optimizations off: otherwise onnxruntime rewrites the graphs (constant folding, fusions) before running
  them, and two equivalent graphs would be rewritten differently;
- weight pre-packing off: with optimizations off onnxruntime still pre-packs constant MatMul weights, and a
  pre-packed GEMM sums in another order than the unpacked one, so a weight behind a Cast or Identity in one graph
  and a plain initializer in the other (exactly what folding produces) would differ in the last bit;
- one intra-op thread by default: no scheduling-dependent reductions (calibration, which only collects ranges,
  asks for two);
- log severity "fatal" for the session, "error" for the process-wide logger: onnxruntime's warnings (unused
  initializers, ...) say nothing about the comparison, and a failing kernel's own error line (which onnxruntime
  also raises, as the exception trtforge reports or skips) would precede the one-line ``error:`` on stderr, or
  stand on the stderr of a check that passed (a value-class draw the original rejects is skipped).

``optimize=True`` (``diff --ort-optimize``) keeps onnxruntime's defaults for graph optimization and pre-packing,
to compare what a production session computes; the thread count and log severity stay deterministic.
"""

from __future__ import annotations

from typing import Any

from onnx import ModelProto

_LOG_ERROR = 3  # onnxruntime severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal
_LOG_FATAL = 4


def quiet_onnxruntime() -> None:
    """onnxruntime's process-wide logger at "error" too: it logs (in colour, on stderr) before a session's own
    severity applies and for sessions trtforge does not create (onnxruntime.quantization's calibrators)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(_LOG_ERROR)


def session_options(*, optimize: bool = False, threads: int = 1) -> Any:
    """``onnxruntime.SessionOptions`` as described in the module docstring."""
    import onnxruntime as ort

    quiet_onnxruntime()
    opts = ort.SessionOptions()
    if optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    else:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.intra_op_num_threads = threads
    opts.log_severity_level = _LOG_FATAL
    return opts


def make_session(model: ModelProto | str, *, optimize: bool = False, threads: int = 1) -> Any:
    """A CPU ``onnxruntime.InferenceSession`` over a model (in memory, or a path, which keeps external data beside
    it readable) with ``session_options(optimize=optimize, threads=threads)``."""
    import onnxruntime as ort

    source = model if isinstance(model, str) else model.SerializeToString()
    opts = session_options(optimize=optimize, threads=threads)
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def ort_feed(value: Any) -> Any:
    """``value`` as onnxruntime's Python API takes it: a bfloat16 or float8 array (ml_dtypes, which numpy cannot
    hand to onnxruntime: "Numpy_type 256 can't be converted") as an ``OrtValue`` of its ONNX type over the same
    bytes; any other array as it is."""
    import numpy as np

    arr = np.asarray(value)
    if arr.dtype.kind != "V" and "float8" not in arr.dtype.name:
        return value
    import onnxruntime as ort
    from onnx import helper

    onnx_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
    bits = np.ascontiguousarray(arr).view(np.dtype(f"u{arr.dtype.itemsize}"))
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx_type)
