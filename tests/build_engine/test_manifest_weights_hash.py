"""The manifest's ``onnx_sha256`` covers the weights (issue 18.9): the model file and every external data file."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import onnx
import pytest

from trtforge.build_engine.engine.builder import build_engine
from trtforge.examples.llama import make_llama

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None,
                                reason="tensorrt_rtx not installed")


def _sha(path: Path) -> str:
    return json.loads((path / "manifest.json").read_text())["onnx_sha256"]


def test_a_changed_weight_byte_changes_onnx_sha256(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save_model(make_llama(seed=3), src, save_as_external_data=True, location="m.onnx.data",
                    size_threshold=1024)
    data = tmp_path / "m.onnx.data"
    build_engine(src, "a10", tmp_path / "e1", backend="tensorrt-rtx", progress=False)
    expected = hashlib.sha256(src.read_bytes() + data.read_bytes()).hexdigest()
    assert _sha(tmp_path / "e1") == expected
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one bit of one weight
    data.write_bytes(bytes(raw))
    build_engine(src, "a10", tmp_path / "e2", backend="tensorrt-rtx", progress=False)
    assert _sha(tmp_path / "e2") != expected
    assert _sha(tmp_path / "e2") == hashlib.sha256(src.read_bytes() + bytes(raw)).hexdigest()


def test_without_external_data_the_hash_is_the_files(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save_model(make_llama(seed=3), src)
    build_engine(src, "a10", tmp_path / "e", backend="tensorrt-rtx", progress=False)
    assert _sha(tmp_path / "e") == hashlib.sha256(src.read_bytes()).hexdigest()


def test_a_model_already_in_the_profile_precision_is_built_from_its_file(tmp_path: Path) -> None:
    """Nothing to convert or fold: TensorRT parses the source file itself and model.onnx is a byte copy of it (its
    weights in model.onnx.data, offsets kept), written on the I/O worker (issue 18.6)."""
    from onnx import numpy_helper

    from trtforge.build_engine.engine.builder import BuildTimings
    from trtforge.build_engine.passes import fold
    from trtforge.build_engine.precision.convert import convert_precision

    bf16 = fold(convert_precision(make_llama(seed=4), "bf16").model).model  # folded twice: nothing left to fold
    src = tmp_path / "b.onnx"
    onnx.save_model(bf16, src, save_as_external_data=True, location="b.onnx.data", size_threshold=1024)
    timings = BuildTimings()
    build_engine(src, "a100", tmp_path / "e", backend="tensorrt-rtx", progress=False, timings=timings)
    assert "copy_onnx" in timings.background and timings.steps["convert"] < 1.0
    built = onnx.load_model(str(tmp_path / "e" / "model.onnx"), load_external_data=False)
    assert {e.value for t in built.graph.initializer for e in t.external_data if e.key == "location"} == {
        "model.onnx.data"}
    a = onnx.load_model(str(src))
    b = onnx.load_model(str(tmp_path / "e" / "model.onnx"))
    assert [n.output for n in a.graph.node] == [n.output for n in b.graph.node]
    for ta, tb in zip(a.graph.initializer, b.graph.initializer, strict=True):
        assert ta.name == tb.name and (numpy_helper.to_array(ta) == numpy_helper.to_array(tb)).all()
