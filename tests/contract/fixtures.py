"""Good inputs for the bad-input harness, built in code (small and fast): models, configs, an adapter, a trace, a
profile and a built engine. Each case copies what it needs and breaks one thing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

A100 = Path(__file__).resolve().parents[2] / "profiles" / "a100.toml"


def tiny_model(path: Path, seed: int = 0, opset: int = 17) -> Path:
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if opset > 30:  # onnx.helper refuses nothing here; keep the IR version it picks
        model.ir_version = 10
    onnx.save(model, path)
    return path


def external_model(path: Path, seed: int = 1) -> Path:
    """``tiny_model`` with its weight in ``<name>.data`` beside it."""
    tiny_model(path, seed)
    model = onnx.load(path)
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=f"{path.name}.data",
              size_threshold=0)
    return path


def adapter(folder: Path, *, r: int = 4, seed: int = 2, config: dict | None = None,
            header: bytes | None = None) -> Path:
    from safetensors.numpy import save_file

    g = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    tensors = {"base_model.model.layers.0.self_attn.q_proj.lora_A.weight": g.standard_normal((r, 16)).astype("f4"),
               "base_model.model.layers.0.self_attn.q_proj.lora_B.weight": g.standard_normal((16, r)).astype("f4")}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    if header is not None:
        (folder / "adapter_model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    cfg = {"r": r, "lora_alpha": 8, "target_modules": ["q_proj"], "peft_type": "LORA"}
    cfg.update(config or {})
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def hf_config(path: Path, **over: object) -> Path:
    from trtforge.examples.llama import hf_config as make

    cfg = dict(make())
    cfg.update(over)
    path.write_text(json.dumps(cfg))  # json writes NaN/Infinity tokens for float('nan'/'inf'): HF files can too
    return path


def trace(path: Path, rows: list[dict] | None = None) -> Path:
    rows = rows or [{"timestamp": i * 100, "input_length": 64, "output_length": 8, "hash_ids": [i]} for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def profile(path: Path, replace: tuple[str, str] | None = None) -> Path:
    text = A100.read_text()
    if replace is not None:
        assert replace[0] in text, replace
        text = text.replace(replace[0], replace[1], 1)
    path.write_text(text)
    return path


_ENGINE_CACHE: dict[str, Path] = {}


def engine(folder: Path) -> Path:
    """A real TensorRT-RTX engine folder of ``tiny_model`` (built once per process, then copied)."""
    if "tiny" not in _ENGINE_CACHE:
        import tempfile

        from trtforge.build_engine.engine.builder import build_engine

        root = Path(tempfile.mkdtemp(prefix="trtforge-contract-"))
        build_engine(str(tiny_model(root / "tiny.onnx")), "a100", str(root / "eng"), backend="tensorrt-rtx",
                     progress=False)
        _ENGINE_CACHE["tiny"] = root / "eng"
    shutil.copytree(_ENGINE_CACHE["tiny"], folder)
    return folder


def injected_model(path: Path) -> Path:
    """The example Llama with LoRA plugin nodes (a valid input for ``lora decompose``)."""
    from trtforge.plugins.lora.inject import inject

    onnx.save(inject(onnx.load(llama(path)), ["q_proj"], 4, 2), path)
    return path


def llama(path: Path) -> Path:
    """A one-layer example Llama (has q_proj for ``lora inject``)."""
    from trtforge.examples.llama import LlamaConfig, make_llama

    onnx.save(make_llama(LlamaConfig(layers=1, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=96,
                                     vocab=64)), path)
    return path
