"""Quantized engines build with TensorRT-RTX for every profile a mode allows and are refused (exit 2) elsewhere."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from trtforge_testing import assert_one_line_error

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None,
                                reason="tensorrt_rtx not installed")
# TensorRT-RTX targets 8.0 (a100), 8.6 (a10), 8.9 (l40s) on a CPU; h100 (9.0) needs full TensorRT.
ALLOWED = {"int8": ("a10", "a100", "l40s"), "int4-wo": ("a10", "a100", "l40s"), "fp8": ("l40s",)}
CASES = [(m, p, p in ALLOWED[m]) for m in ALLOWED for p in ("a10", "a100", "l40s")]


@pytest.mark.parametrize(("mode", "profile", "allowed"), CASES, ids=[f"{m}-{p}" for m, p, _ in CASES])
def test_build_or_refuse(mode: str, profile: str, allowed: bool, quantized: dict[str, Path], cli,
                         tmp_path: Path) -> None:
    out = tmp_path / "engine"
    res = cli("build", quantized[mode], "--profile", profile, "-o", out, "--no-progress")
    if not allowed:
        assert_one_line_error(res, 2, f"profile '{profile}'", "fp8")
        assert not out.exists()
        return
    assert res.code == 0, res.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == mode
    q = manifest["quantization"]
    assert q["mode"] == mode and q["calibration"].startswith("generated from the model")
    assert q["excluded"] == ["/lm_head/MatMul"] and q["quantized"] == 7
    assert (out / "model.plan").stat().st_size > 0
    # Built as is: the Q/DQ graph TensorRT parsed is the quantized model (no fp16/bf16 conversion around it).
    import onnx

    built = onnx.load(out / "model.onnx")
    assert sum(n.op_type == "DequantizeLinear" for n in built.graph.node) == \
        sum(n.op_type == "DequantizeLinear" for n in onnx.load(quantized[mode]).graph.node)
    low = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    assert not any(t.data_type in low for t in built.graph.initializer)
