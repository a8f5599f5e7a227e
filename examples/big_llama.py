"""The example Llama at a real model's size (over 2 GiB of weights), written without holding the weights in memory.

``write_big_llama(path, vocab=..., hidden=...)`` builds the example decoder's graph (``llama.make_llama``: same
nodes, names, Casts and Identities a torch export carries) at a tiny vocabulary, then gives it the requested
vocabulary: the token embedding ``[vocab, hidden]`` and ``lm_head`` ``[hidden, vocab]`` become the big tensors. All
weights go to ONE external-data file beside the model (``<name>.data``, offsets aligned to 4 KiB like
``onnx.save_model``'s), written in chunks of ``_CHUNK_ROWS`` rows: peak memory is one chunk, not the weights.

The big tables' values are seeded normal numbers (scale 0.02, like ``llama_weights``) drawn once for one chunk and
reused with a per-chunk sign flip and row shift, so writing 2 GiB costs disk bandwidth, not 500 M random draws; the
small weights are ``llama_weights``'s exactly. Protobuf cannot hold 2 GiB in one message, so this model can only be
used by path (or with its external data kept external); that is what it exists to test.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from .llama import LlamaConfig, hf_config, make_llama

_ALIGN = 4096
_CHUNK_ROWS = 8192
_BIG = ("model.embed_tokens.weight", "lm_head.weight")
#: A vocabulary that puts the fp32 model just over 2 GiB at hidden 256 (2 x 1,050,000 x 256 x 4 bytes + layers).
VOCAB_OVER_2GIB = 1_050_000
BIG_CONFIG = LlamaConfig(layers=1, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512,
                         vocab=VOCAB_OVER_2GIB)


@dataclass(frozen=True)
class BigModel:
    path: Path
    data_path: Path
    config: LlamaConfig
    weight_bytes: int  # bytes of all weights (the data file's payload, without alignment padding)


def _set_external(t: TensorProto, location: str, offset: int, length: int) -> None:
    t.ClearField("raw_data")
    del t.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    t.data_location = TensorProto.EXTERNAL


def _pad(fh: object, pos: int) -> int:
    gap = (-pos) % _ALIGN
    if gap:
        fh.write(b"\0" * gap)  # type: ignore[attr-defined]
    return pos + gap


def _write_table(fh: object, rows: int, cols: int, transpose: bool, base: np.ndarray) -> int:
    """Write a ``[rows, cols]`` fp32 table (``[cols, rows]`` when ``transpose``) chunk by chunk; returns bytes."""
    written = 0
    if not transpose:
        for k, start in enumerate(range(0, rows, _CHUNK_ROWS)):
            n = min(_CHUNK_ROWS, rows - start)
            chunk = np.roll(base, k, axis=0)[:n] * (1.0 if k % 2 == 0 else -1.0)
            fh.write(np.ascontiguousarray(chunk, dtype=np.float32).tobytes())  # type: ignore[attr-defined]
            written += chunk.nbytes
        return written
    # lm_head [hidden, vocab]: row r holds column chunk k of a seeded table, written row by row.
    for r in range(cols):
        row = np.empty(rows, np.float32)
        for k, start in enumerate(range(0, rows, _CHUNK_ROWS)):
            n = min(_CHUNK_ROWS, rows - start)
            row[start:start + n] = base[:n, (r + k) % base.shape[1]] * (1.0 if (r + k) % 3 else -1.0)
        fh.write(row.tobytes())  # type: ignore[attr-defined]
        written += row.nbytes
    return written


def write_big_llama(path: str | Path, config: LlamaConfig = BIG_CONFIG, seed: int = 0) -> BigModel:
    """Write the example Llama with ``config`` (its vocabulary sets the size) to ``path`` + ``<name>.data``."""
    path = Path(path)
    small = make_llama(replace(config, vocab=64), "fp32", seed)
    data_name = f"{path.name}.data"
    data_path = path.with_name(data_name)
    rng = np.random.default_rng(seed + 1)
    base = (rng.standard_normal((_CHUNK_ROWS, config.hidden)) * 0.02).astype(np.float32)
    pos = total = 0
    with open(data_path, "wb") as fh:
        for t in small.graph.initializer:
            pos = _pad(fh, pos)
            if t.name in _BIG:
                transpose = t.name == "lm_head.weight"
                n = _write_table(fh, config.vocab, config.hidden, transpose, base)
                del t.dims[:]
                t.dims.extend([config.hidden, config.vocab] if transpose else [config.vocab, config.hidden])
            else:
                raw = onnx.numpy_helper.to_array(t).tobytes()
                fh.write(raw)
                n = len(raw)
            _set_external(t, data_name, pos, n)
            pos += n
            total += n
    out = small.graph.output[0].type.tensor_type.shape.dim[2]
    out.Clear()
    out.dim_value = config.vocab
    props = {p.key: p for p in small.metadata_props}
    props["trtforge.config"].value = json.dumps(asdict(config))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(small.SerializeToString())
    tmp.replace(path)
    return BigModel(path=path, data_path=data_path, config=config, weight_bytes=total)


def write_hf_config(path: str | Path, config: LlamaConfig = BIG_CONFIG) -> Path:
    """The model's HF ``config.json`` (for ``trtforge kv-plan --model``)."""
    p = Path(path)
    p.write_text(json.dumps(hf_config(config), indent=2) + "\n")
    return p
