"""Every command on a model over 2 GiB (issue 18): the example Llama with a 1,050,000-token vocabulary, 2.00 GiB of
fp32 weights in one external-data file (``examples.big_llama``), written chunk by chunk in pytest's temporary folder
once per session and removed at the end with everything made from it.

Protobuf cannot serialise 2 GiB: every step that handed the whole model to onnx's checker, shape inference or an
in-memory onnxruntime session failed here. The chain is the user's: fold --check, precision (fp16 and bf16), lora
inject on the fp16 model, lora decompose, diff fp16 vs fp32 and LoRA vs base, build for a100 (TensorRT-RTX), triton,
kv-plan. Peak disk: about 9 GB.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

from trtforge.build_engine.cli import main
from trtforge.examples.big_llama import BigModel, write_big_llama, write_hf_config

pytestmark = pytest.mark.slow
T = onnx.TensorProto


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigModel]:
    folder = tmp_path_factory.mktemp("big")
    model = write_big_llama(folder / "big.onnx")
    assert model.weight_bytes > 2**31  # over protobuf's limit
    yield model
    shutil.rmtree(folder, ignore_errors=True)  # ~9 GB; pytest keeps the last three sessions' folders otherwise


def _run(*argv: object) -> None:
    code = main([str(a) for a in argv])
    assert code == 0, argv


def _graph(path: Path) -> onnx.ModelProto:
    return onnx.load_model(str(path), load_external_data=False)


def _data_files(path: Path) -> set[str]:
    return {e.value for t in _graph(path).graph.initializer for e in t.external_data if e.key == "location"}


@pytest.fixture(scope="module")
def fp16(big: BigModel) -> Path:
    out = big.path.with_name("fp16.onnx")
    _run("precision", big.path, "-o", out, "--to", "fp16")
    return out


@pytest.fixture(scope="module")
def lora(fp16: Path) -> Path:
    out = fp16.with_name("lora.onnx")
    _run("lora", "inject", fp16, "-o", out, "--targets", "q_proj,v_proj", "--max-rank", "8", "--slots", "2")
    return out


def test_fold_check_runs_both_models_by_path(big: BigModel, capsys: pytest.CaptureFixture[str]) -> None:
    out, report = big.path.with_name("fold.onnx"), big.path.with_name("fold.json")
    _run("fold", big.path, "-o", out, "--report", report, "--check")
    rep = json.loads(report.read_text())
    assert rep["check"]["passed"] and rep["check"]["runtime"] == "onnxruntime"
    assert rep["nodes_after"] < rep["nodes_before"]
    assert _data_files(out) == {"fold.onnx.data"}
    assert out.with_name("fold.onnx.data").stat().st_size >= big.weight_bytes
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no staged folder left
    out.unlink()
    out.with_name("fold.onnx.data").unlink()


def test_precision_fp16_halves_the_weights(big: BigModel, fp16: Path) -> None:
    g = _graph(fp16).graph
    emb = next(t for t in g.initializer if t.name.startswith("model.embed_tokens.weight"))
    assert emb.data_type == T.FLOAT16 and list(emb.dims) == [big.config.vocab, big.config.hidden]
    size = fp16.with_name("fp16.onnx.data").stat().st_size
    assert big.weight_bytes / 2 <= size < big.weight_bytes / 2 + (1 << 24)


def test_lora_inject_and_decompose(lora: Path) -> None:
    plugins = [n for n in _graph(lora).graph.node if n.op_type == "LoRAOpPluginDynamic"]
    assert len(plugins) == 2  # q_proj and v_proj of the one layer
    assert _data_files(lora) == {"lora.onnx.data"}
    dec = lora.with_name("dec.onnx")
    _run("lora", "decompose", lora, "-o", dec)
    g = _graph(dec).graph
    assert not [n for n in g.node if n.op_type == "LoRAOpPluginDynamic"]
    assert _data_files(dec) == {"dec.onnx.data"}  # external data in, external data out
    dec.unlink()
    dec.with_name("dec.onnx.data").unlink()


def test_diff_fp16_against_fp32(big: BigModel, fp16: Path) -> None:
    _run("diff", fp16, big.path, "--precision", "fp16", "--shape", "input_ids:1,4")


def test_diff_lora_model_against_its_base(lora: Path, fp16: Path) -> None:
    # Every slot -1: the LoRA model (decomposed for onnxruntime) must compute exactly what its base computes.
    _run("diff", lora, fp16, "--atol", "0", "--rtol", "0", "--shape", "input_ids:1,4", "--shape", "lora_slot_ids:1,4",
         "--value", "lora_slot_ids=-1", "--extra-inputs")


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="tensorrt_rtx not installed")
def test_build_triton_and_kv_plan(big: BigModel, tmp_path: Path) -> None:
    bf16 = big.path.with_name("bf16.onnx")
    _run("precision", big.path, "-o", bf16, "--to", "bf16")
    eng = big.path.with_name("engine")
    _run("build", bf16, "--profile", "a100", "-o", eng, "--backend", "tensorrt-rtx", "--no-progress")
    manifest = json.loads((eng / "manifest.json").read_text())
    assert manifest["precision"] == "bf16"
    assert (eng / manifest["plan"]).stat().st_size > big.weight_bytes / 2  # the bf16 weights are in the plan
    for p in (bf16, bf16.with_name("bf16.onnx.data")):
        p.unlink()
    repo = big.path.with_name("repo")
    _run("triton", eng, "--repo", repo, "--name", "big")
    assert (repo / "big" / "config.pbtxt").is_file() and (repo / "big" / "1" / "model.plan").is_file()
    shutil.rmtree(repo)
    shutil.rmtree(eng)
    config = write_hf_config(tmp_path / "config.json", big.config)
    _run("kv-plan", "--profile", "a100", "--model", config)


def test_quantize_int8_with_the_lm_head(big: BigModel) -> None:
    # The 1 GiB LM head quantized too: calibration runs the model by path, each weight is read from its file, and
    # the embedding (left float) is copied file to file into the output's data.
    out, report = big.path.with_name("int8.onnx"), big.path.with_name("int8.json")
    _run("quantize", big.path, "-o", out, "--mode", "int8", "--quantize-lm-head", "--calib-size", "2",
         "--report", report)
    rep = json.loads(report.read_text())
    assert {n["weight"] for n in rep["nodes"]} >= {"lm_head.weight"}
    g = _graph(out).graph
    head = next(t for t in g.initializer if t.name.startswith("lm_head.weight") and t.data_type == T.INT8)
    assert list(head.dims) == [big.config.hidden, big.config.vocab]
    assert _data_files(out) == {"int8.onnx.data"}
    assert out.with_name("int8.onnx.data").stat().st_size >= big.weight_bytes / 2 + big.weight_bytes / 8
    for p in (out, out.with_name("int8.onnx.data"), report):
        p.unlink()
