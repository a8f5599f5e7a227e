"""Running the float model on the calibration samples (onnxruntime, CPU): activation statistics and ranges.

``collect`` runs the model once per sample with the target activations added as graph outputs and keeps, per
activation, the per-channel max |x| (SmoothQuant), the per-channel mean |x| (AWQ) and, when asked, a bounded
random subset of rows (AWQ's scale search measures the projection error on real activations). ``ranges`` computes
one per-tensor |x| bound per activation with onnxruntime.quantization's calibrators (MinMax, Percentile, Entropy:
the machinery is theirs, only the tensor selection is ours, so their augmented model carries just the targets).

Models with ``LoRAOpPluginDynamic`` nodes are lowered to standard ops first (``lora.decompose``), with slot ids -1
in the samples: calibration sees the base model, never an adapter.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper

from trtforge.plugins.lora.decompose import decompose

from ..core.errors import InputError
from ..core.graph import PROTO_LIMIT
from ..verify.sessions import make_session, ort_feed
from .calib_data import Sample

_MAX_ROWS = 512  # rows kept per tensor for AWQ's search: its cost is GRID x rows x in x out per projection


@dataclass(frozen=True)
class ActStats:
    amax: np.ndarray       # [K] max |x| per input channel over every calibration token
    mean_abs: np.ndarray   # [K] mean |x| per input channel
    rows: np.ndarray | None  # [n <= _MAX_ROWS, K] sampled tokens (None unless asked)


def _with_outputs(model: ModelProto, tensors: Sequence[str]) -> ModelProto:
    m = decompose(model)
    present = {o.name for o in m.graph.output}
    for name in tensors:
        if name not in present:
            m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return m


def _session(model: ModelProto | str) -> Any:
    return make_session(model, threads=2)  # graph optimizations off: exact fp32, no fusions


def _weight_bytes(model: ModelProto) -> int:
    """The model's tensor bytes, If/Loop/Scan bodies' and Constants' included (they count toward 2 GiB too)."""
    from ..core.onnx_tensors import tensor_bytes

    return tensor_bytes(model)


def _by_path(model: ModelProto, data_dir: Path | None) -> bool:
    """Whether onnxruntime must run ``model`` from a file: some weights are still on disk (a lazy load: written
    tensor by tensor, those copied file to file, so no weight is held by this process twice), or its weights near
    protobuf's 2 GiB limit (onnxruntime serialises a model given in memory, which fails for every model over 2 GiB:
    any 1B-parameter fp32 LLM)."""
    from ..core.lazy_weights import has_lazy

    return (data_dir is not None and has_lazy(model)) or _weight_bytes(model) >= PROTO_LIMIT


def _save_external(model: ModelProto, path: Path, data_dir: Path | None = None) -> None:
    """``model`` at ``path`` with every tensor of 1 KiB or more in its data file, bodies' and Constants' too: the
    temporary copy must fit protobuf's 2 GiB wherever its weights are. Weights still on disk (in ``data_dir``) are
    copied file to file."""
    from ..core.onnx_save import save_model
    from ..core.onnx_tensors import body_fingerprints

    save_model(model, path, external_data=True, source_dir=data_dir, external_tensors=body_fingerprints(model))


@contextlib.contextmanager
def _runnable(model: ModelProto, data_dir: Path | None = None) -> Iterator[ModelProto | str]:
    """``model`` itself, or (``_by_path``) the path of a temporary copy with external data."""
    if not _by_path(model, data_dir):
        yield model
        return
    with tempfile.TemporaryDirectory(prefix="trtforge-calib-") as tmp:
        path = Path(tmp) / "model.onnx"
        _save_external(model, path, data_dir)
        yield str(path)


def _run(sess: Any, sample: Sample, outputs: Sequence[str]) -> list[np.ndarray]:
    import onnxruntime as ort

    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # fatal only: a failing kernel's own log line would precede our one-line error
    try:
        return sess.run(list(outputs), {k: ort_feed(v) for k, v in sample.items()}, quiet)
    except Exception as exc:  # onnxruntime reports bad feeds with its own exception types
        text = " ".join(str(exc).split())[:200]
        raise InputError(f"calibration: onnxruntime cannot run the model on a sample ({text}); check the calibration "
                         "inputs' shapes") from exc


def collect(model: ModelProto, tensors: Sequence[str], samples: Sequence[Sample], keep_rows: bool,
            seed: int = 0, data_dir: Path | None = None) -> dict[str, ActStats]:
    """``data_dir``: where the weights of a lazily loaded ``model`` still on disk are (onnxruntime reads them)."""
    tensors = list(dict.fromkeys(tensors))
    augmented = _with_outputs(model, tensors)
    with _runnable(augmented, data_dir) as source:
        try:
            sess = _session(source)
        except Exception as exc:  # onnxruntime's own exception types (Fail, InvalidGraph, ...)
            raise _unloadable(decompose(model), exc) from exc
        return _collect(sess, tensors, samples, keep_rows, seed)


def _unloadable(model: ModelProto, exc: Exception) -> Exception:
    """What to raise when onnxruntime cannot load the model to calibrate: an InputError when onnx's strict shape
    inference rejects it too (its declared shapes or types disagree with its ops, as in the source: a Gemm whose B
    does not fit A ended in 'internal error', exit 3), else ``exc`` itself (then the fault is trtforge's)."""
    from ..core.shape_inference import infer_shapes

    try:
        infer_shapes(model, strict=True, check_type=True)
    except Exception as bad:  # noqa: BLE001 -- any failure of onnx's inference is the model's
        text = " ".join(str(bad).split())[:300]
        return InputError(f"onnxruntime cannot load the model and onnx's strict shape inference rejects it ({text}); "
                          "fix the export (its declared shapes or types disagree with its ops), then quantize it")
    return exc


def _collect(sess: Any, tensors: list[str], samples: Sequence[Sample], keep_rows: bool,
             seed: int) -> dict[str, ActStats]:
    amax: dict[str, np.ndarray] = {}
    total: dict[str, np.ndarray] = {}
    count: dict[str, int] = {}
    rows: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    rng = np.random.default_rng(seed)
    per_sample = max(1, _MAX_ROWS // max(1, len(samples)))
    for sample in samples:
        for name, value in zip(tensors, _run(sess, sample, tensors), strict=True):
            if not value.size:  # no token on this sample (a zero-size dim): it adds no statistic
                continue
            x = np.abs(value.reshape(-1, value.shape[-1]).astype(np.float32))
            amax[name] = np.maximum(amax[name], x.max(0)) if name in amax else x.max(0)
            total[name] = total[name] + x.sum(0, dtype=np.float64) if name in total else x.sum(0, dtype=np.float64)
            count[name] = count.get(name, 0) + x.shape[0]
            if keep_rows:
                flat = value.reshape(-1, value.shape[-1])
                pick = rng.choice(flat.shape[0], size=min(per_sample, flat.shape[0]), replace=False)
                rows[name].append(flat[np.sort(pick)].astype(np.float32))
    for t in tensors:  # every later step (SmoothQuant, AWQ, the calibrators' histograms) needs finite values
        if t not in amax:
            raise InputError(f"calibration: activation {t!r} is empty (a zero-size dim) on every calibration sample, "
                             "so it has no range to calibrate; give samples where it has elements (--calib), or keep "
                             "its projections float with --exclude")
        if not np.all(np.isfinite(amax[t])):
            raise InputError(f"calibration: activation {t!r} is NaN or infinite on the calibration samples (the float "
                             "model computes it so: NaN/inf weights upstream, or float32 overflow); fix the model "
                             "or the samples")
    return {t: ActStats(amax[t], (total[t] / count[t]).astype(np.float32),
                        np.concatenate(rows[t]) if keep_rows else None) for t in tensors}


#: onnxruntime.quantization's PercentileCalibrater / EntropyCalibrater as trtforge configured them (symmetric;
#: num_quantized_bins, percentile: the HistogramCalibrater defaults those calibrators pass on where not given)
_HISTOGRAM: dict[str, dict[str, Any]] = {
    "percentile": {"num_bins": 2048, "num_quantized_bins": 2048, "percentile": 99.99},
    "entropy": {"num_bins": 2048, "num_quantized_bins": 128, "percentile": 99.999},
}


def _calibratable(model: ModelProto, tensors: Sequence[str]) -> list[str]:
    """The ``tensors`` onnxruntime's calibrators would calibrate (``select_tensors_to_calibrate``): a node's input or
    output, typed float32/float16 by shape inference (of the weight-free skeleton), not an initializer."""
    from ..core.shape_inference import infer_shapes

    m = decompose(model)
    try:
        inferred = infer_shapes(m)
    except Exception:  # noqa: BLE001 -- inference's own errors: every tensor is typed by the session instead
        return list(tensors)
    g = inferred.graph
    types = {vi.name: vi for vi in [*g.value_info, *g.output, *g.input]}
    inits = {t.name for t in m.graph.initializer}
    used = {name for n in m.graph.node for name in (*n.input, *n.output)}
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16)
    return [t for t in tensors if t in used and t not in inits and t in types
            and types[t].type.HasField("tensor_type") and types[t].type.tensor_type.elem_type in floats]


def _histogram_session(source: ModelProto | str) -> Any:
    """The session onnxruntime's calibrators create (``create_inference_session``): optimizations off, the rest
    onnxruntime's defaults (weight pre-packing on), so the activations are theirs bit for bit."""
    import onnxruntime as ort

    from ..verify.sessions import quiet_onnxruntime

    quiet_onnxruntime()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    data = source if isinstance(source, str) else source.SerializeToString()
    return ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])


def ranges(model: ModelProto, tensors: Sequence[str], samples: Sequence[Sample], method: str,
           data_dir: Path | None = None) -> dict[str, float]:
    """Per-tensor |x| bound of each activation in ``tensors`` by onnxruntime.quantization's histogram calibration
    (``method``: percentile or entropy; its ``HistogramCollector``, fed what its calibrators feed it, so the ranges
    are theirs). Not through the calibrator classes: they load the whole model with its weights (``onnx.load`` after
    shape inference) and save an augmented copy for their session, which loads the weights once more, and they keep
    every output of every sample; here the model runs as ``collect`` runs it (by path when ``data_dir`` holds weights
    still on disk) and only the wanted activations are kept."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, HistogramCollector, TensorsData

    tensors = list(dict.fromkeys(tensors))
    found = _calibratable(model, tensors)
    values: dict[str, list[np.ndarray]] = {t: [] for t in found}
    with _runnable(_with_outputs(model, found), data_dir) as source:
        sess = _histogram_session(source)
        for sample in samples:
            for name, value in zip(found, _run(sess, sample, found), strict=True):
                values[name].append(value)
        del sess
    collector = HistogramCollector(method=method, symmetric=True, scenario="same", **_HISTOGRAM[method])
    kind = CalibrationMethod.Percentile if method == "percentile" else CalibrationMethod.Entropy
    # onnxruntime's collector prints progress on stdout ("Collecting tensor data and making histogram ..."); stdout
    # is the command's own summary
    with contextlib.redirect_stdout(io.StringIO()):
        if values:
            collector.collect(values)
        data = TensorsData(kind, collector.compute_collection_result()) if values else {}
    out: dict[str, float] = {}
    for name in tensors:
        if name not in data:
            raise InputError(f"calibration: onnxruntime's {method} calibrator found no range for {name!r}")
        lo, hi = (float(np.asarray(v).max()) for v in (np.abs(data[name].range_value[0]),
                                                          np.abs(data[name].range_value[1])))
        out[name] = max(lo, hi)  # 0 for an all-zero activation: ``numerics.act_scale`` floors every range alike
    return out
