"""Which float32 constants an fp16 conversion may not clip: those holding a finite value beyond +-65504 (precision
policy rule 8: their consumers stay fp32, as clipping ``x * 1e5`` to 65504 would change the result).

Read from constants held in memory only: a weight still on disk (lazy loading of external data) is not read here.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, numpy_helper

_FP16_MAX = float(np.finfo(np.float16).max)
FLOAT = TensorProto.FLOAT


def beyond_fp16(consts: dict[str, TensorProto], to: str) -> frozenset[str]:
    """float32 constants held in memory with a finite value beyond +-65504 (for fp16 only): clipping them would change
    the result, so their consumers stay fp32 (policy rule 8). Weights still on disk (lazy load) are not read."""
    if to != "fp16":
        return frozenset()
    out: set[str] = set()
    for name, t in consts.items():
        if t.data_type != FLOAT or t.data_location == TensorProto.EXTERNAL:
            continue
        if holds_beyond_fp16(numpy_helper.to_array(t).reshape(-1)):
            out.add(name)
    return frozenset(out)


def holds_beyond_fp16(flat: np.ndarray, chunk: int = 1 << 20) -> bool:
    """Whether a finite value beyond +-65504 is in ``flat``, read in chunks (a weight of hundreds of MB would
    otherwise need three temporaries of its size: the mask, the finite values and their magnitudes)."""
    for i in range(0, flat.size, chunk):
        c = np.abs(flat[i:i + chunk])
        if bool(np.any((c > _FP16_MAX) & np.isfinite(c))):
            return True
    return False
