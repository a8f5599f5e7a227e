"""The projections' weights, read and written one at a time: never all of them in memory at once.

A float weight is read (``WeightReader``: from the model, or from its file when a lazy load left it on disk) when a
step needs its values, used and dropped: the NaN/inf check, the migration scales (one group of projections sharing
an activation at a time), and the written form (``store``: migrated, clipped, quantized right away). Only the
quantized values (a quarter of the float weights for int8/fp8, an eighth for int4) are kept until the rewrite.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
from onnx import ModelProto, TensorProto, numpy_helper

from ..core.errors import InputError
from ..core.lazy_weights import LAZY_MIN_BYTES, to_array
from ..core.onnx_save import point_external
from . import awq
from .calibrators import ActStats
from .config import QuantConfig
from .numerics import quantize_weight
from .qdq import StoredWeight
from .targets import Target

#: name of a float32 initializer -> its values (a fresh array: callers may scale it)
WeightReader = Callable[[str], np.ndarray]


def reader(model: ModelProto, data_dir: Path | None) -> WeightReader:
    """Reads ``model``'s initializers by name, from ``data_dir`` for those still on disk."""
    inits = {t.name: t for t in model.graph.initializer}

    def read(name: str) -> np.ndarray:
        return to_array(inits[name], data_dir).astype(np.float32)

    return read


def refuse_nonfinite(t: Target, w: np.ndarray, what: str = "") -> None:
    """Refuse NaN / infinite weights (exit 2): a scale computed from them is NaN or inf, and the stored values would
    silently turn every output non-finite (or, for inf under int8's clipping, wrong)."""
    if not np.all(np.isfinite(w)):
        bad = int(np.count_nonzero(~np.isfinite(w)))
        raise InputError(f"{t.name}: weight {t.weight!r} {what}holds {bad} NaN or infinite values; quantization "
                         f"needs finite weights (fix the source model, or keep it float with --exclude {t.name})")


def check_finite(targets: Sequence[Target], read: WeightReader) -> None:
    for t in targets:
        refuse_nonfinite(t, read(t.weight))


def _key(w: np.ndarray, block: int, clip: np.ndarray | None) -> bytes:
    """Digest of what is quantized: equal digests are equal arrays (the weights are finite, so equal values are
    equal bytes) with the same block and clip ratios."""
    h = hashlib.sha256(np.ascontiguousarray(w).data)
    h.update(f"|{block}|{w.shape}|".encode())
    if clip is not None:
        h.update(np.ascontiguousarray(clip).data)
    return h.digest()


def store(t: Target, w: np.ndarray, mode: str, block: int, clip: np.ndarray | None,
          done: dict[tuple[str, bytes], StoredWeight]) -> StoredWeight:
    """``w`` (migrated) quantized, or the form already stored for the same source weight and key."""
    key = _key(w, block, clip)
    found = done.get((t.weight, key))
    if found is not None:
        return StoredWeight(t, found.q, found.scale, block, key)
    q, scale = quantize_weight(w, mode, block, clip)
    done[(t.weight, key)] = made = StoredWeight(t, q, scale, block, key)
    return made


def written(targets: Sequence[Target], read: WeightReader, scales: Mapping[str, np.ndarray],
            stats: Mapping[str, ActStats], blocks: Mapping[str, int],
            cfg: QuantConfig) -> tuple[list[StoredWeight], dict[str, float]]:
    """Each target's stored weight (node order) and, for AWQ, each activation's calibration error of the weights
    as written (scales and clipping both applied)."""
    awq_mode = cfg.mode == "int4-wo" and cfg.int4_method == "awq"
    done: dict[tuple[str, bytes], StoredWeight] = {}
    out: list[StoredWeight] = []
    terms: dict[str, tuple[float, float]] = {}
    for t in targets:
        w = read(t.weight)
        s = scales.get(t.x)
        ws = w * s[:, None] if s is not None else w
        refuse_nonfinite(t, ws, "times the migration scales ")
        clip = None
        rows = stats[t.x].rows if awq_mode and t.x in stats else None
        if rows is not None:
            clip = awq.clip_search(rows / s if s is not None else rows, ws, blocks[t.x])
            n, d = awq.written_terms(rows, w, ws, clip, s, blocks[t.x])
            num, den = terms.get(t.x, (0.0, 0.0))
            terms[t.x] = (num + n, den + d)
        del w  # the float weight (when migrated, ``ws`` is a copy): one of them at a time while quantizing
        out.append(store(t, ws, cfg.mode, blocks[t.x], clip, done))
        del ws
    return out, {x: awq.written_ratio(num, den) for x, (num, den) in terms.items()}


_ALIGN = 4096


@contextlib.contextmanager
def spill() -> Iterator[Callable[[np.ndarray, str], TensorProto]]:
    """A function that turns a float32 array into an initializer named ``name``: arrays of at least
    ``lazy_weights.LAZY_MIN_BYTES`` go to a temporary data file (removed on exit) and the initializer points there
    by its absolute path, as a weight a lazy load left on disk points into its model's folder (``save_model(...,
    source_dir=...)`` copies it, ``lazy_weights.to_array`` reads it); smaller ones stay in memory. For a temporary
    model with new weights (the migrated s * W the histogram calibrators run) that must not hold them all."""
    with tempfile.TemporaryDirectory(prefix="trtforge-spill-") as tmp:
        path = Path(tmp) / "spilled.data"
        with open(path, "wb") as fh:

            def put(w: np.ndarray, name: str) -> TensorProto:
                if w.nbytes < LAZY_MIN_BYTES:
                    return numpy_helper.from_array(w, name)
                pos = fh.tell()
                fh.write(b"\0" * ((-pos) % _ALIGN))
                pos = fh.tell()
                fh.write(np.ascontiguousarray(w, dtype="<f4").data)
                fh.flush()
                t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=w.shape)
                point_external(t, str(path), pos, w.nbytes)
                return t

            yield put
