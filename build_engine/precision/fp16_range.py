"""Which float32 constants an fp16 conversion may not clip: those holding a finite value beyond +-65504 (precision
policy rule 8: their consumers stay fp32, as clipping ``x * 1e5`` to 65504 would change the result).

A weight still on disk (lazy loading of external data) is read from its file in chunks when the caller gives its
folder (``data_dir``); without it such a weight cannot be read and is not judged (``onnx_io.load`` without ``lazy``
holds every weight in memory). A padding mask of ``finfo.min`` big enough to stay on disk is the case this covers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, numpy_helper

_FP16_MAX = float(np.finfo(np.float16).max)
FLOAT = TensorProto.FLOAT


def beyond_fp16(consts: dict[str, TensorProto], to: str, data_dir: Path | None = None) -> frozenset[str]:
    """float32 constants with a finite value beyond +-65504 (for fp16 only): clipping them would change the result,
    so their consumers stay fp32 (policy rule 8). ``data_dir``: the folder of a lazily loaded model, whose weights
    still on disk are read from there, in chunks."""
    if to != "fp16":
        return frozenset()
    out: set[str] = set()
    for name, t in consts.items():
        if t.data_type != FLOAT:
            continue
        if t.data_location == TensorProto.EXTERNAL:
            if data_dir is not None and _on_disk_beyond_fp16(t, data_dir):
                out.add(name)
        elif holds_beyond_fp16(numpy_helper.to_array(t).reshape(-1)):
            out.add(name)
    return frozenset(out)


def _on_disk_beyond_fp16(tensor: TensorProto, data_dir: Path) -> bool:
    from ..core.lazy_weights import read_chunks

    return any(holds_beyond_fp16(part) for part in read_chunks(tensor, data_dir, "<f4", 1 << 20))


def holds_beyond_fp16(flat: np.ndarray, chunk: int = 1 << 20) -> bool:
    """Whether a finite value beyond +-65504 is in ``flat``, read in chunks (a weight of hundreds of MB would
    otherwise need three temporaries of its size: the mask, the finite values and their magnitudes)."""
    for i in range(0, flat.size, chunk):
        c = np.abs(flat[i:i + chunk])
        if bool(np.any((c > _FP16_MAX) & np.isfinite(c))):
            return True
    return False
