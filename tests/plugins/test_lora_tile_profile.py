"""The GPU profile's ``[lora] tile`` (its LoRA tile default) reaches the plugin: ``lora inject``
without ``--tile`` writes no tile, and ``trtforge build`` writes the profile's into each such node, so TensorRT-RTX
parses the a10 profile's 32 (a100's 64); a node ``inject --tile`` pinned keeps its own. Before, every injected node
carried 128 and no build read the profile's tile."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from trtforge.build_engine.core import onnx_io
from trtforge.build_engine.engine.builder import _convert
from trtforge.build_engine.engine.timings import BuildTimings
from trtforge.examples.llama import make_llama
from trtforge.plugins.lora import spec
from trtforge.plugins.lora.inject import inject
from trtforge.profiles.loader import load_profile
from trtforge_testing import parse_plugin_layers


def _tiles(model: onnx.ModelProto) -> list[int | None]:
    return [next((a.i for a in n.attribute if a.name == "tile"), None)
            for n in model.graph.node if n.op_type == spec.PLUGIN_NAME]


def _staged(tmp_path: Path, tile: int | None, profile: str) -> onnx.ModelProto:
    path = tmp_path / f"lora_{tile}.onnx"
    onnx.save(inject(make_llama(), ["v_proj"], max_rank=8, slots=4, tile=tile), path)
    return _convert(path, onnx_io.load(path), load_profile(profile), BuildTimings()).model


def test_inject_writes_a_tile_only_when_asked() -> None:
    assert set(_tiles(inject(make_llama(), ["v_proj"], 8, 4))) == {None}
    assert set(_tiles(inject(make_llama(), ["v_proj"], 8, 4, tile=64))) == {64}


@pytest.mark.parametrize("profile,tile", [("a10", 32), ("a100", 64), ("h100", 128)])
def test_build_writes_the_profiles_tile(tmp_path: Path, profile: str, tile: int) -> None:
    assert load_profile(profile).lora.tile == tile
    assert set(_tiles(_staged(tmp_path, None, profile))) == {tile}
    assert set(_tiles(_staged(tmp_path, 256, profile))) == {256}  # pinned by inject --tile


def test_tensorrt_rtx_parses_the_profiles_tile(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    from trtforge.build_engine.engine.backend import prepare_plugin_loading, select_backend
    from trtforge.plugins import register_all

    backend = select_backend("tensorrt-rtx")
    prepare_plugin_loading(backend)
    register_all(backend.module)
    rtx = backend.module
    path = tmp_path / "staged.onnx"
    onnx.save(_staged(tmp_path, None, "a10"), path)
    _, _, layers = parse_plugin_layers(rtx, path)
    assert [layer.plugin.fields.tile for layer in layers] == [32, 32]  # the example's 2 layers x v_proj
