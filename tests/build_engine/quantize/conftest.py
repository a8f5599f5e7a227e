"""A tiny Llama (one layer, hidden 128) so each mode quantizes in well under a second and builds in about one."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from quant_testing import TINY

from trtforge.examples.llama import make_llama


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("quant") / "tiny.onnx"
    onnx.save(make_llama(TINY, seed=3), path)
    return path


@pytest.fixture(scope="session")
def quantized(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each mode's output of ``trtforge quantize`` on the tiny model (generated calibration, seed 0)."""
    from trtforge.build_engine.cli import main

    folder = tmp_path_factory.mktemp("quantized")
    out = {}
    for mode in ("int8", "int4-wo", "fp8"):
        out[mode] = folder / f"tiny_{mode}.onnx"
        assert main(["quantize", str(tiny_path), "-o", str(out[mode]), "--mode", mode, "--calib-size", "8",
                     "--report", str(folder / f"{mode}.json")]) == 0
    return out

