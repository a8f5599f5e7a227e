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
