"""The Polygraphy extension: real ``polygraphy convert`` with TensorRT-RTX builds a model with LoRA plugin nodes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import seeded_rng

pytest.importorskip("tensorrt_rtx")
pytest.importorskip("polygraphy")


def _lora_model(tmp_path: Path) -> Path:
    """Two projections (q_proj, v_proj) with LoRA plugin nodes injected by trtforge's own pass."""
    from trtforge.plugins.lora.inject import inject

    rng = seeded_rng("test_polygraphy_plugin._lora_model")
    h = 64
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", h])
    outs, nodes, inits = [], [], []
    for proj in ("q_proj", "v_proj"):
        w = numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32),
                                    f"model.layers.0.self_attn.{proj}.weight")
        inits.append(w)
        nodes.append(helper.make_node("MatMul", ["x", w.name], [proj], name=f"/model/layers.0/self_attn/{proj}/MatMul"))
        outs.append(helper.make_tensor_value_info(proj, TensorProto.FLOAT, ["batch", "sequence", h]))
    base = helper.make_model(helper.make_graph(nodes, "g", [x], outs, inits),
                             opset_imports=[helper.make_opsetid("", 17)])
    model = inject(base, ["q_proj", "v_proj"], max_rank=8, slots=4)
    from trtforge.plugins import has_plugin_nodes

    assert has_plugin_nodes(model)
    path = tmp_path / "lora.onnx"
    onnx.save(model, path)
    return path


def test_entry_point_declared() -> None:
    from importlib import metadata

    eps = metadata.entry_points().select(group="polygraphy.run.plugins")
    assert "trtforge" in eps.names
    assert eps["trtforge"].value == "trtforge.build_engine.engine.polygraphy_plugin:register"


def test_register_returns_no_arg_groups_and_registers_creators() -> None:
    import tensorrt_rtx as trt

    from trtforge.build_engine.engine.polygraphy_plugin import register_plugins
    from trtforge.plugins.lora import spec

    assert register_plugins(trt)
    creator = trt.get_plugin_registry().get_creator(spec.PLUGIN_NAME, spec.PLUGIN_VERSION, spec.PLUGIN_NAMESPACE)
    assert creator is not None


def test_polygraphy_convert_builds_lora_model(tmp_path: Path) -> None:
    model = _lora_model(tmp_path)
    plan = tmp_path / "lora.plan"
    exe = Path(sys.executable).with_name("polygraphy")
    env = {**os.environ, "POLYGRAPHY_USE_TENSORRT_RTX": "1"}
    proc = subprocess.run([str(exe), "convert", str(model), "--compute-capabilities", "8.0", "8.6", "-o", str(plan)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "Failed to load plugin" not in log, log[-3000:]
    assert plan.is_file() and plan.stat().st_size > 0
    # the engine holds the plugin layers (serialized by creator name and namespace), not a plugin-free fallback
    data = plan.read_bytes()
    assert b"LoRAOpPluginDynamic" in data and b"trtforge" in data


def test_without_rtx_variable_nothing_is_imported(tmp_path: Path) -> None:
    """Without POLYGRAPHY_USE_TENSORRT_RTX, the hook targets full TensorRT, which is absent here: it registers
    nothing and imports no TensorRT module, so unrelated Polygraphy commands are unaffected."""
    code = ("import sys; from trtforge.build_engine.engine.polygraphy_plugin import register; "
            "assert register() == []; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorrt', 'tensorrt_rtx')))")
    env = {k: v for k, v in os.environ.items() if k != "POLYGRAPHY_USE_TENSORRT_RTX"}
    import importlib.util

    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("full TensorRT is installed here; the hook would register into it")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
