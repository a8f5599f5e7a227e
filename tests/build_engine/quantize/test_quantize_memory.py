"""``trtforge quantize`` on a model with external data never holds its weights more than once: the weights stay on
disk (lazy load), each projection's weight is read when it is quantized, calibration runs the model by path
(onnxruntime reads the weights itself) and the histogram calibrators never load the model with its weights.
Structural guards (what is handed to onnxruntime, what is loaded, what stays on disk), not memory measurements;
the written model is the in-memory path's bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from trtforge.build_engine.cli import main
from trtforge.examples.big_llama import write_big_llama
from trtforge.examples.llama import LlamaConfig
from trtforge_testing import seed_for

# q/o/gate/up/down and the embedding / LM head are at least lazy_weights.LAZY_MIN_BYTES (1 MiB): left on disk
CFG = LlamaConfig(layers=1, hidden=512, heads=8, kv_heads=2, head_dim=64, intermediate=1024, vocab=1024)
MODES = [("int8", ()), ("int4-wo", ()), ("int4-wo", ("--int4-method", "rtn")), ("fp8", ()),
         ("int8", ("--calibrator", "percentile")), ("fp8", ("--calibrator", "entropy"))]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("external") / "model.onnx"
    write_big_llama(path, CFG, seed=seed_for("quantize-memory"))
    return path


def _tensors(path: Path) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    m = onnx.load(str(path))
    return {t.name: (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()) for t in m.graph.initializer}


def _spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, seen: list[Any],
         what: Callable[..., Any]) -> None:
    """Record ``what(*args, **kwargs)`` of each call of ``owner.name`` and call the real function."""
    real = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(what(*args, **kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)


@pytest.mark.parametrize(("mode", "extra"), MODES)
def test_calibration_runs_the_model_by_path_and_the_output_is_the_in_memory_one(
        mode: str, extra: tuple[str, ...], source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every onnxruntime session of calibration gets a file (the weights are read by onnxruntime, not serialised
    from this process), no ``onnx.load`` reads the weights (onnxruntime's own calibrators did: the whole model, then
    an augmented copy), and the output's tensors equal, byte for byte, those of ``quantize`` on the model loaded
    into memory."""
    import onnxruntime as ort

    from trtforge.build_engine.core import onnx_io, onnx_save
    from trtforge.build_engine.quantize import QuantConfig, generate, quantize

    seed = seed_for(f"quantize-memory-{mode}-{extra}") % 1000
    argv = ["--mode", mode, "--seed", str(seed), "--calib-size", "3", "--calib-seq", "8", *extra]
    sessions: list[Any] = []
    loads: list[bool] = []
    _spy(monkeypatch, ort, "InferenceSession", sessions, lambda model, *a, **k: type(model))
    for fn in ("load", "load_model"):
        _spy(monkeypatch, onnx, fn, loads, lambda *a, **k: k.get("load_external_data", True))
    out = tmp_path / "lazy.onnx"
    assert main(["quantize", str(source), "-o", str(out), *argv]) == 0
    assert sessions and set(sessions) == {str}, sessions
    assert not any(loads), "onnx.load read a model with its weights during quantize"
    monkeypatch.undo()
    eager = onnx_io.load(source).model  # weights in memory: the path of the Python API on an in-memory model
    cfg = QuantConfig(mode=mode, calib_size=3, seq_len=8, seed=seed, calibrator=extra[1] if "--calibrator" in extra
                      else "max", int4_method=extra[1] if "--int4-method" in extra else "awq")
    ref = tmp_path / "eager.onnx"
    onnx_save.save_model(quantize(eager, cfg, generate(eager, 3, 8, seed)).model, ref, external_data=True)
    assert _tensors(out) == _tensors(ref)


def test_weights_left_float_stay_on_disk_through_quantize(source: Path) -> None:
    """On a lazily loaded model the weights quantize leaves float (embedding, LM head) are never read into the
    model: they are still references into the source's data file, which the save copies file to file."""
    from trtforge.build_engine.core import onnx_io
    from trtforge.build_engine.quantize import QuantConfig, generate, quantize

    loaded = onnx_io.load(source, lazy=True)
    cfg = QuantConfig(mode="int8", calib_size=2, seq_len=8, seed=seed_for("quantize-memory-lazy") % 1000)
    result = quantize(loaded.model, cfg, generate(loaded.model, 2, 8, cfg.seed), data_dir=source.parent)
    inits = {t.name: t for t in result.model.graph.initializer}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert inits[name].data_location == TensorProto.EXTERNAL and not inits[name].HasField("raw_data"), name
    quantized = [t for t in result.model.graph.initializer if t.data_type == TensorProto.INT8 and len(t.dims) == 2]
    assert len(quantized) == len(result.report.nodes) > 0
    # the float weights of the projections are gone from the result (only their int8 forms are written)
    assert not {n.weight for n in result.report.nodes} & set(inits)


def test_quantize_weight_is_exact_by_column_slices() -> None:
    """The stored values and scales computed a slice of output channels at a time equal those of the whole weight
    at once (every step is per channel or elementwise), for every mode."""
    from trtforge.build_engine.quantize import numerics

    rng = np.random.default_rng(seed_for("quantize-weight-slices"))
    w = (rng.standard_normal((64, 40)) * rng.uniform(0.01, 10.0, 40)).astype(np.float32)
    clip = rng.uniform(0.5, 1.0, (4, 40)).astype(np.float32)
    for mode, kwargs in (("int8", {}), ("fp8", {}), ("int4-wo", {"block": 16, "clip": clip})):
        whole = numerics.quantize_weight(w, mode, **kwargs)  # type: ignore[arg-type]
        chunk = numerics._CHUNK
        numerics._CHUNK = 64 * 3  # three columns per slice: 14 slices, the last one short
        try:
            sliced = numerics.quantize_weight(w, mode, **kwargs)  # type: ignore[arg-type]
        finally:
            numerics._CHUNK = chunk
        assert sliced[0].dtype == whole[0].dtype
        assert sliced[0].tobytes() == whole[0].tobytes() and sliced[1].tobytes() == whole[1].tobytes(), mode
        if mode == "int8":  # the arithmetic itself: round(w / max|w[:, n]| * 127)
            expected = np.rint(w / (np.abs(w).max(0) / np.float32(127.0)).astype(np.float32))
            np.testing.assert_array_equal(sliced[0].astype(np.float32), np.clip(expected, -127, 127))
