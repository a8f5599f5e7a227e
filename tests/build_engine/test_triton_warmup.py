"""Triton ``model_warmup`` from the manifest: one sample per optimization profile at its opt shape, data files of
the right size with token ids inside the vocabulary, ``--no-warmup``, and ``--check`` catching broken samples."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from trtforge_testing import assert_one_line_error

pytest.importorskip("tritonclient.grpc.model_config_pb2")

VOCAB = 50


def _engine(tmp_path: Path, *, with_onnx: bool, static_first: bool = False) -> Path:
    """A manifest with two profiles (and, optionally, the model.onnx it came from: an embedding of VOCAB rows)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    d = tmp_path / "engine"
    d.mkdir()
    plan = np.random.default_rng(3).bytes(256)
    (d / "model.plan").write_bytes(plan)
    profiles = [{"min": [1, 1], "opt": [2, 16], "max": [4, 64]}, {"min": [1, 1], "opt": [4, 48], "max": [8, 128]}]
    ids = {"name": "input_ids", "dtype": "int64", "shape": [-1, -1], "profiles": profiles}
    mask = {"name": "attention_mask", "dtype": "float16", "shape": [-1, -1], "profiles": profiles}
    if static_first:
        for t in (ids, mask):
            t["shape"] = [2, -1]
            t["profiles"] = [{"min": [2, 1], "opt": [2, 16], "max": [2, 64]}] * 2
    manifest = {"format": 1, "plan": "model.plan", "backend": {"name": "tensorrt_rtx", "version": "1.7.1.116"},
                "profile": "a100", "precision": "fp16", "compute_capabilities": ["8.0"], "inputs": [ids, mask],
                "outputs": [{"name": "hidden", "dtype": "float16", "shape": [-1, -1, 8]}],
                "optimization_profiles": 2, "plugins": [], "onnx_sha256": "0" * 64,
                "plan_sha256": hashlib.sha256(plan).hexdigest(), "build_seconds": 0.1}
    (d / "manifest.json").write_text(json.dumps(manifest))
    if with_onnx:
        emb = numpy_helper.from_array(np.random.default_rng(0).standard_normal((VOCAB, 8)).astype(np.float16), "emb")
        graph = helper.make_graph(
            [helper.make_node("Gather", ["emb", "input_ids"], ["g"]),
             helper.make_node("Unsqueeze", ["attention_mask", "axes"], ["m"]),
             helper.make_node("Mul", ["g", "m"], ["hidden"])], "g",
            [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
             helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT16, ["b", "s"])],
            [helper.make_tensor_value_info("hidden", TensorProto.FLOAT16, ["b", "s", 8])],
            [emb, numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), d / "model.onnx")
    return d


def _proto(entry: Path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    return text_format.Parse((entry / "config.pbtxt").read_text(), pb.ModelConfig())


def _values(entry: Path, sample, name: str, dtype: str) -> np.ndarray:
    t = sample.inputs[name]
    return np.fromfile(entry / "warmup" / t.input_data_file, dtype=dtype).reshape(tuple(t.dims))


@pytest.mark.parametrize("with_onnx, high", [(True, VOCAB - 1), (False, 7)])
def test_one_sample_per_profile_at_opt_shape(tmp_path: Path, cli, with_onnx: bool, high: int) -> None:
    from trtforge.build_engine.triton.config import config_from_proto, render

    res = cli("triton", _engine(tmp_path, with_onnx=with_onnx), "--repo", tmp_path / "repo", "--name", "m")
    assert res.code == 0, res.err
    entry = tmp_path / "repo" / "m"
    proto = _proto(entry)
    assert proto.max_batch_size == 4
    # profile 0 opt [2, 16]; profile 1 opt [4, 48]: batch = opt batch (Triton sends that many batch-1 requests)
    assert [(w.name, w.batch_size) for w in proto.model_warmup] == [("profile_0", 2), ("profile_1", 4)]
    ids = [_values(entry, w, "input_ids", "int64") for w in proto.model_warmup]
    assert [a.shape for a in ids] == [(16,), (48,)]
    both = np.concatenate(ids)
    assert both.min() >= 0 and both.max() <= high and len(set(both.tolist())) > 3  # valid token ids, not constant
    mask = np.concatenate([_values(entry, w, "attention_mask", "float16") for w in proto.model_warmup])
    assert np.isfinite(mask).all() and np.abs(mask).max() <= 1.0
    cfg = config_from_proto(proto)
    assert config_from_proto(_proto_text(render(cfg))) == cfg
    assert cli("triton", "--check", entry).code == 0


def _proto_text(text: str):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    return text_format.Parse(text, pb.ModelConfig())


def test_no_batching_uses_full_opt_shape(tmp_path: Path, cli) -> None:
    res = cli("triton", _engine(tmp_path, with_onnx=False, static_first=True), "--repo", tmp_path / "r", "--name", "m")
    assert res.code == 0, res.err
    proto = _proto(tmp_path / "r" / "m")
    assert proto.max_batch_size == 0
    assert {w.batch_size for w in proto.model_warmup} == {1}
    assert [list(w.inputs["input_ids"].dims) for w in proto.model_warmup] == [[2, 16], [2, 16]]


def test_no_warmup_flag(tmp_path: Path, cli) -> None:
    res = cli("triton", _engine(tmp_path, with_onnx=False), "--repo", tmp_path / "r", "--name", "m", "--no-warmup")
    assert res.code == 0, res.err
    assert not _proto(tmp_path / "r" / "m").model_warmup and not (tmp_path / "r" / "m" / "warmup").exists()


_BROKEN = [
    ("truncated file", lambda e, t: ((e / "warmup" / "profile_0.0.bin").write_bytes(b"\0" * 8), t)[1],
     "holds 8 bytes"),
    ("missing file", lambda e, t: ((e / "warmup" / "profile_1.1.bin").unlink(), t)[1], "is missing"),
    ("escaping file", lambda e, t: t.replace('"profile_0.0.bin"', '"../1/model.plan"'), "outside warmup/"),
    ("wrong dtype", lambda e, t: t.replace("TYPE_FP16\n      dims: 16", "TYPE_FP32\n      dims: 16"),
     "data_type TYPE_FP32 but the input is TYPE_FP16"),
    ("outside the profiles", lambda e, t: t.replace("dims: 48", "dims: 4096"), "outside every optimization profile"),
    ("batch above max", lambda e, t: t.replace("\n  batch_size: 4", "\n  batch_size: 9"),
     "batch_size 9 must be 1..max_batch_size (4)"),
    ("input missing", lambda e, t: t.replace('key: "attention_mask"', 'key: "mask"', 1),
     "['attention_mask'] missing"),
]


@pytest.mark.parametrize("desc, breaks, reason", _BROKEN, ids=[b[0] for b in _BROKEN])
def test_check_rejects_broken_warmup(tmp_path: Path, cli, desc: str, breaks, reason: str) -> None:
    assert cli("triton", _engine(tmp_path, with_onnx=False), "--repo", tmp_path / "r", "--name", "m").code == 0
    entry = tmp_path / "r" / "m"
    text = (entry / "config.pbtxt").read_text()
    broken = breaks(entry, text)
    (entry / "config.pbtxt").write_text(broken)
    assert_one_line_error(cli("triton", "--check", entry), 1, reason)


def test_real_engine_token_ids_inside_the_vocabulary(tmp_path: Path, cli) -> None:
    """`trtforge build` (TensorRT-RTX on CPU) keeps model.onnx beside the plan: warm-up token ids stay below the
    example model's vocabulary, one sample per profile at its opt shape, and --check accepts the entry."""
    pytest.importorskip("tensorrt_rtx")
    import onnx

    from trtforge.examples.llama import LlamaConfig, make_llama

    vocab = 96
    onnx.save(make_llama(LlamaConfig(layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                                     vocab=vocab)), tmp_path / "m.onnx")
    assert cli("build", tmp_path / "m.onnx", "--profile", "a100", "-o", tmp_path / "eng").code == 0
    manifest = json.loads((tmp_path / "eng" / "manifest.json").read_text())
    res = cli("triton", tmp_path / "eng", "--repo", tmp_path / "repo", "--name", "llama")
    assert res.code == 0, res.err
    entry = tmp_path / "repo" / "llama"
    proto = _proto(entry)
    assert len(proto.model_warmup) == manifest["optimization_profiles"]
    ids_in = manifest["inputs"][0]
    assert ids_in["name"] == "input_ids"
    drawn = []
    for k, w in enumerate(proto.model_warmup):
        opt = ids_in["profiles"][k]["opt"]
        assert w.batch_size == min(opt[0], proto.max_batch_size) and list(w.inputs["input_ids"].dims) == opt[1:]
        drawn.append(_values(entry, w, "input_ids", "int64"))
    ids = np.concatenate(drawn)
    assert ids.min() >= 0 and ids.max() < vocab
    assert ids.max() > 7  # the vocabulary's range (read from model.onnx), not the small-integer fallback
    assert cli("triton", "--check", entry).code == 0


def test_warmup_data_in_the_engines_type_not_the_onnx_one(tmp_path: Path, cli, rng: np.random.Generator) -> None:
    """A float64 ONNX input is a float32 binding in the engine (TensorRT has no float64): the warm-up file was drawn
    in the ONNX type (8 bytes per value), so the entry `trtforge triton` wrote failed its own --check ("holds 128
    bytes, dims [16] of TYPE_FP32 need 64") and Triton's warm-up would refuse it."""
    pytest.importorskip("tensorrt_rtx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["x32", "w"], ["y"])],
        "f64", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "f64.onnx")
    assert cli("build", tmp_path / "f64.onnx", "--profile", "a10", "-o", tmp_path / "eng", "--no-progress").code == 0
    assert json.loads((tmp_path / "eng" / "manifest.json").read_text())["inputs"][0]["dtype"] == "float32"
    res = cli("triton", tmp_path / "eng", "--repo", tmp_path / "repo", "--name", "m")
    assert res.code == 0, res.err
    entry = tmp_path / "repo" / "m"
    for sample in _proto(entry).model_warmup:
        x = sample.inputs["x"]
        assert (entry / "warmup" / x.input_data_file).stat().st_size == 4 * int(np.prod(x.dims))
    assert cli("triton", "--check", entry).code == 0
