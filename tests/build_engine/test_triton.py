"""Triton repository writer and validator: configs parse with tritonclient's real ModelConfig protobuf."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from trtforge_testing import assert_one_line_error, seeded_rng

pytest.importorskip("tritonclient.grpc.model_config_pb2")


def _manifest(plan: bytes, *, batch_max: tuple[int, ...] = (8, 16), plugins: list | None = None,
              static_first: bool = False) -> dict:
    profiles = [{"min": [1, 1], "opt": [max(1, m // 2), 64], "max": [m, 256]} for m in batch_max]
    inputs = [{"name": "input_ids", "dtype": "int64", "shape": [-1, -1], **profiles[0], "profiles": profiles}]
    if static_first:
        inputs.append({"name": "lora_a", "dtype": "float16", "shape": [4, 256, 16],
                       "profiles": [{"min": [4, 256, 16], "opt": [4, 256, 16], "max": [4, 256, 16]}] * len(profiles)})
    return {"format": 1, "plan": "model.plan", "backend": {"name": "tensorrt_rtx", "version": "1.7.1.116"},
            "profile": "a100", "precision": "bf16", "compute_capabilities": ["8.0"], "inputs": inputs,
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, -1, 1024]}],
            "optimization_profiles": len(profiles), "plugins": plugins or [],
            "onnx_sha256": "0" * 64, "plan_sha256": hashlib.sha256(plan).hexdigest(), "build_seconds": 0.5}


def _engine(tmp_path: Path, name: str = "engine", **kw) -> Path:
    d = tmp_path / name
    d.mkdir()
    plan = seeded_rng(f"test_triton._engine.{name}").bytes(4096)
    (d / "model.plan").write_bytes(plan)
    (d / "manifest.json").write_text(json.dumps(_manifest(plan, **kw)))
    return d


def _parse(text: str):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    return text_format.Parse(text, pb.ModelConfig())


def test_write_parses_and_round_trips(tmp_path: Path, cli) -> None:
    from trtforge.build_engine.triton.config import config_from_proto, render

    eng = _engine(tmp_path)
    res = cli("triton", eng, "--repo", tmp_path / "repo", "--name", "llama", "--instances", "2")
    assert res.code == 0, res.err
    entry = tmp_path / "repo" / "llama"
    text = (entry / "config.pbtxt").read_text()
    proto = _parse(text)
    assert proto.platform == "tensorrt_plan" and proto.name == "llama"
    assert proto.max_batch_size == 8  # min over profiles of max batch
    assert [list(i.dims) for i in proto.input] == [[-1]] and [list(o.dims) for o in proto.output] == [[-1, 1024]]
    assert list(proto.dynamic_batching.preferred_batch_size) == [4, 8]
    assert proto.instance_group[0].count == 2 and list(proto.instance_group[0].profile) == ["0", "1"]
    assert (entry / "1" / "model.plan").read_bytes() == (eng / "model.plan").read_bytes()
    # parse -> render -> parse is the identity
    cfg = config_from_proto(proto)
    assert _parse(render(cfg)) == proto and config_from_proto(_parse(render(cfg))) == cfg
    assert cli("triton", "--check", entry).code == 0
    # no temporary folders left in the repository
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["llama"]


def test_static_first_dim_means_no_batching(tmp_path: Path, cli) -> None:
    eng = _engine(tmp_path, static_first=True)
    assert cli("triton", eng, "--repo", tmp_path / "r", "--name", "m").code == 0
    proto = _parse((tmp_path / "r" / "m" / "config.pbtxt").read_text())
    assert proto.max_batch_size == 0 and not proto.HasField("dynamic_batching")
    assert [list(i.dims) for i in proto.input] == [[-1, -1], [4, 256, 16]]
    assert_one_line_error(cli("triton", eng, "--repo", tmp_path / "r2", "--name", "m", "--max-batch", "2"), 2,
                          "--max-batch 2", "not a dynamic batch")


def test_max_batch_option(tmp_path: Path, cli) -> None:
    eng = _engine(tmp_path)
    assert cli("triton", eng, "--repo", tmp_path / "r", "--name", "m", "--max-batch", "2").code == 0
    proto = _parse((tmp_path / "r" / "m" / "config.pbtxt").read_text())
    assert proto.max_batch_size == 2 and list(proto.dynamic_batching.preferred_batch_size) == [2]
    assert_one_line_error(cli("triton", eng, "--repo", tmp_path / "r", "--name", "n", "--max-batch", "9"), 2,
                          "--max-batch 9", "at most batch 8")
    assert not (tmp_path / "r" / "n").exists()


@pytest.mark.parametrize("name", ["..", "../evil", "a/b", "/abs", "", ".hidden", "sp ace", "-dash"])
def test_bad_names_rejected(tmp_path: Path, cli, name: str) -> None:
    eng = _engine(tmp_path)
    repo = tmp_path / "repo"
    assert_one_line_error(cli("triton", eng, "--repo", repo, "--name", name), 2, "--name")
    assert not repo.exists() or list(repo.iterdir()) == []
    assert not (tmp_path / "evil").exists()


def test_python_plugin_refused(tmp_path: Path, cli) -> None:
    eng = _engine(tmp_path, plugins=[{"name": "LoRAOpPluginDynamic", "namespace": "trtforge", "version": "1",
                                      "implementation": "python"}])
    res = cli("triton", eng, "--repo", tmp_path / "repo", "--name", "m")
    assert_one_line_error(res, 2, "trtforge::LoRAOpPluginDynamic", "--backend tensorrt", "lora decompose")
    assert not (tmp_path / "repo" / "m").exists()


def test_missing_or_invalid_manifest(tmp_path: Path, cli) -> None:
    d = tmp_path / "e"
    d.mkdir()
    assert_one_line_error(cli("triton", d, "--repo", tmp_path / "r", "--name", "m"), 2, "manifest.json", "missing")
    (d / "manifest.json").write_text("{not json")
    assert_one_line_error(cli("triton", d, "--repo", tmp_path / "r", "--name", "m"), 2, "not valid JSON")
    (d / "manifest.json").write_text(json.dumps({"format": 1, "plan": "model.plan", "inputs": [],
                                                 "outputs": []}))
    assert_one_line_error(cli("triton", d, "--repo", tmp_path / "r", "--name", "m"), 2, "'inputs'")


def test_failing_write_leaves_nothing(tmp_path: Path, cli) -> None:
    """The plan changes after the build: the copy fails verification after config.pbtxt was already written in the
    temporary folder; neither a new folder nor a temporary one is left, and an existing entry is kept."""
    eng = _engine(tmp_path)
    repo = tmp_path / "repo"
    assert cli("triton", eng, "--repo", repo, "--name", "keep").code == 0
    before = (repo / "keep" / "config.pbtxt").read_bytes()
    (eng / "model.plan").write_bytes(os.urandom(4096))
    assert_one_line_error(cli("triton", eng, "--repo", repo, "--name", "new"), 2, "sha256")
    assert_one_line_error(cli("triton", eng, "--repo", repo, "--name", "keep", "--force"), 2, "sha256")
    assert sorted(p.name for p in repo.iterdir()) == ["keep"]
    assert (repo / "keep" / "config.pbtxt").read_bytes() == before
    assert_one_line_error(cli("triton", eng, "--repo", repo, "--name", "keep"), 2, "already exists", "--force")


_BROKEN = [
    # (description, text transform, expected reason fragment, expected line finder)
    ("unknown field", lambda t: t.replace("max_batch_size: 8", "max_batch_size: 8\nmax_batchsize: 4"),
     "no field named \"max_batchsize\"", "max_batchsize"),
    ("bad enum", lambda t: t.replace("TYPE_INT64", "TYPE_INT65"), "TYPE_INT65", "TYPE_INT65"),
    ("preferred above max", lambda t: t.replace("preferred_batch_size: 8", "preferred_batch_size: 16"),
     "preferred_batch_size 16", "preferred_batch_size: 16"),
    ("missing profile", lambda t: t.replace('profile: "1"', 'profile: "2"'),
     "profile '2' does not exist", 'profile: "2"'),
    ("dims inconsistent", lambda t: t.replace("dims: -1\n  dims: 1024", "dims: [ -1, 1000 ]"),
     "dims [-1, 1000] do not match", "dims: [ -1, 1000 ]"),
    ("wrong data type", lambda t: t.replace("TYPE_FP32", "TYPE_FP16"), "data_type TYPE_FP16", "TYPE_FP16"),
    ("unknown tensor name", lambda t: t.replace('"logits"', '"probs"'), "'probs' is not an output", '"probs"'),
    ("max batch above engine", lambda t: t.replace("max_batch_size: 8", "max_batch_size: 32")
     .replace("preferred_batch_size: 8\n", ""), "exceeds the engine's largest batch 8", "max_batch_size"),
    ("kind cpu", lambda t: t.replace("KIND_GPU", "KIND_CPU"), "only on GPU", "KIND_CPU"),
]


@pytest.mark.parametrize("desc,transform,reason,marker", _BROKEN, ids=[b[0] for b in _BROKEN])
def test_broken_configs_rejected_with_line(tmp_path: Path, cli, desc, transform, reason, marker) -> None:
    from trtforge.build_engine.triton.config import load_for_triton
    from trtforge.build_engine.triton.validate import validate_text

    eng = _engine(tmp_path)
    repo = tmp_path / "repo"
    assert cli("triton", eng, "--repo", repo, "--name", "m").code == 0
    cfg = repo / "m" / "config.pbtxt"
    broken = transform(cfg.read_text())
    cfg.write_text(broken)
    line = next(i for i, ln in enumerate(broken.splitlines(), 1) if marker in ln)
    _, problems = validate_text(broken, load_for_triton(eng), expected_name="m")
    assert problems and any(p.line == line and reason in p.reason for p in problems), (problems, line)
    res = cli("triton", "--check", repo / "m")
    assert_one_line_error(res, 1, f"config.pbtxt:{line}:", reason)


def test_check_rejects_escaping_and_missing(tmp_path: Path, cli) -> None:
    assert_one_line_error(cli("triton", "--check", tmp_path / "nope"), 2, "not a folder")
    (tmp_path / "repo" / "empty").mkdir(parents=True)
    assert_one_line_error(cli("triton", "--check", tmp_path / "repo" / "empty"), 1, "config.pbtxt: missing")
    assert_one_line_error(cli("triton", "--check", tmp_path / "repo" / "empty", "--name", "x"), 2, "--check")


def test_real_engine_from_trtforge_build(tmp_path: Path, cli) -> None:
    """Build the bundled example with the real builder (TensorRT-RTX on CPU) and write a repository from it."""
    pytest.importorskip("tensorrt_rtx")
    import onnx

    from trtforge.examples.llama import LlamaConfig, make_llama

    model = make_llama(LlamaConfig(layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                                   vocab=128))
    onnx.save(model, tmp_path / "m.onnx")
    res = cli("build", tmp_path / "m.onnx", "--profile", "a100", "-o", tmp_path / "eng")
    assert res.code == 0, res.err
    manifest = json.loads((tmp_path / "eng" / "manifest.json").read_text())
    res = cli("triton", tmp_path / "eng", "--repo", tmp_path / "repo", "--name", "llama")
    assert res.code == 0, res.err
    proto = _parse((tmp_path / "repo" / "llama" / "config.pbtxt").read_text())
    assert [i.name for i in proto.input] == [t["name"] for t in manifest["inputs"]]
    assert [o.name for o in proto.output] == [t["name"] for t in manifest["outputs"]]
    assert len(proto.instance_group[0].profile) == manifest["optimization_profiles"]
    first = manifest["inputs"][0]
    assert proto.max_batch_size == min(p["max"][0] for p in first["profiles"])
    assert [list(i.dims) for i in proto.input] == [t["shape"][1:] for t in manifest["inputs"]]
    plan = (tmp_path / "eng" / "model.plan").read_bytes()
    assert (tmp_path / "repo" / "llama" / "1" / "model.plan").read_bytes() == plan
    assert "note: " in res.err and "TensorRT-RTX" in res.err  # the runtime caveat is a note on stderr
    quiet = cli("triton", tmp_path / "eng", "--repo", tmp_path / "repo", "--name", "quiet", "-q")
    assert quiet.code == 0 and "note:" not in quiet.err + quiet.out  # --quiet: no notes (it printed on stdout)
    assert cli("triton", "--check", tmp_path / "repo" / "llama").code == 0


def test_real_lora_engine_refused(tmp_path: Path, cli, rng: np.random.Generator) -> None:
    """A LoRA-injected model built by the real builder records its Python plugin; Triton output is refused."""
    pytest.importorskip("tensorrt_rtx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtforge.plugins.lora.inject import inject

    h = 32
    w = numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32),
                                "model.layers.0.self_attn.q_proj.weight")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", w.name], ["y"], name="/model/layers.0/self_attn/q_proj/MatMul")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", h])], [w])
    model = inject(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), ["q_proj"], max_rank=4,
                   slots=2)
    onnx.save(model, tmp_path / "lora.onnx")
    res = cli("build", tmp_path / "lora.onnx", "--profile", "a100", "-o", tmp_path / "eng")
    assert res.code == 0, res.err
    manifest = json.loads((tmp_path / "eng" / "manifest.json").read_text())
    assert any(p.get("implementation") == "python" for p in manifest["plugins"])
    res = cli("triton", tmp_path / "eng", "--repo", tmp_path / "repo", "--name", "lora")
    assert_one_line_error(res, 2, "Python plugin", "--backend tensorrt", "lora decompose")
    assert not (tmp_path / "repo" / "lora").exists()


# What the string-concatenating renderer wrote before config.pbtxt was printed from the protobuf (same configs as
# _PRINTED below): the printed text must parse to the very same ModelConfig.
_BEFORE_PROTO_PRINTING = ['''# header
name: "llama"
platform: "tensorrt_plan"
max_batch_size: 8
input [
  {
    name: "input_ids"
    data_type: TYPE_INT64
    dims: [ -1 ]
  }
]
output [
  {
    name: "logits"
    data_type: TYPE_FP32
    dims: [ -1, 1024 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
instance_group [
  {
    count: 2
    kind: KIND_GPU
    profile: [ "0", "1" ]
  }
]
''', '''# header
name: "we\\"ird\\\\name"
platform: "tensorrt_plan"
max_batch_size: 0
input [
  {
    name: "input_ids"
    data_type: TYPE_INT64
    dims: [ -1, -1 ]
  },
  {
    name: "lora_a"
    data_type: TYPE_FP16
    dims: [ 4, 256, 16 ]
  }
]
output [
  {
    name: "logits"
    data_type: TYPE_FP32
    dims: [ -1, -1, 1024 ]
  }
]
instance_group [
  {
    count: 1
    kind: KIND_GPU
    profile: [ "0" ]
  }
]
''']


def test_printed_config_equals_the_hand_assembled_one() -> None:
    from trtforge.build_engine.triton.config import TensorConfig as T
    from trtforge.build_engine.triton.config import TritonConfig, config_from_proto, render, to_proto

    printed = [
        TritonConfig(name="llama", max_batch_size=8, inputs=(T("input_ids", "TYPE_INT64", (-1,)),),
                     outputs=(T("logits", "TYPE_FP32", (-1, 1024)),), preferred_batch_sizes=(4, 8),
                     max_queue_delay_us=100, dynamic_batching=True, instance_count=2, profiles=("0", "1")),
        TritonConfig(name='we"ird\\name', max_batch_size=0,
                     inputs=(T("input_ids", "TYPE_INT64", (-1, -1)), T("lora_a", "TYPE_FP16", (4, 256, 16))),
                     outputs=(T("logits", "TYPE_FP32", (-1, -1, 1024)),), profiles=("0",)),
    ]
    for cfg, before in zip(printed, _BEFORE_PROTO_PRINTING, strict=True):
        text = render(cfg, "header")
        assert text.startswith("# header\n")
        assert _parse(text) == _parse(before) == to_proto(cfg)
        assert config_from_proto(_parse(text)) == cfg


def _engine_with(tmp_path: Path, name: str, extra_inputs: list, extra_outputs: list) -> Path:
    d = _engine(tmp_path, name)
    m = json.loads((d / "manifest.json").read_text())
    m["inputs"] += extra_inputs
    m["outputs"] += extra_outputs
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def test_batch_only_tensors_get_dims_one_and_an_empty_reshape(tmp_path: Path, cli) -> None:
    """An input or output of shape [batch] (sequence lengths, a per-sequence score) was written without dims, which
    tritonserver refuses ("model output 'score' must specify 'dims'"), and --check passed it."""
    prof = [{"min": [1], "opt": [max(1, m // 2)], "max": [m]} for m in (8, 16)]
    eng = _engine_with(tmp_path, "e", [{"name": "lengths", "dtype": "int32", "shape": [-1], "profiles": prof}],
                       [{"name": "score", "dtype": "float32", "shape": [-1]}])
    repo = tmp_path / "repo"
    assert cli("triton", eng, "--repo", repo, "--name", "m").code == 0
    text = (repo / "m" / "config.pbtxt").read_text()
    proto = _parse(text)
    for t in [*proto.input, *proto.output]:
        assert list(t.dims), t.name  # Triton requires dims on every tensor
    batch_only = {t.name: (list(t.dims), t.HasField("reshape"), list(t.reshape.shape))
                  for t in [*proto.input, *proto.output] if t.name in ("lengths", "score")}
    assert batch_only == {"lengths": ([1], True, []), "score": ([1], True, [])}
    assert [list(w.inputs["lengths"].dims) for w in proto.model_warmup] == [[1], [1]]
    assert cli("triton", "--check", repo / "m").code == 0
    from trtforge.build_engine.triton.config import config_from_proto, render

    assert _parse(render(config_from_proto(proto))) == proto  # the reshape survives the round trip
    cfg = repo / "m" / "config.pbtxt"
    cfg.write_text(text.replace("  dims: 1\n  reshape {\n  }\n", ""))  # what trtforge wrote before
    assert_one_line_error(cli("triton", "--check", repo / "m"), 1, "no dims; Triton requires them")


def test_scalar_tensor_refused(tmp_path: Path, cli) -> None:
    """A scalar engine input: tritonserver refuses it ("scalar tensors are not supported"); the write is refused
    with the fix instead of writing a config the server cannot load."""
    eng = _engine_with(tmp_path, "e", [{"name": "temperature", "dtype": "float32", "shape": [],
                                        "profiles": [{"min": [], "opt": [], "max": []}] * 2}], [])
    res = cli("triton", eng, "--repo", tmp_path / "repo", "--name", "m")
    assert_one_line_error(res, 2, "manifest.json", "(temperature) is a scalar", "shape [1]")
    assert not (tmp_path / "repo").exists()


def test_other_backends_entries_need_their_model_file(tmp_path: Path, cli) -> None:
    """A repository mixing engines with another backend's entry: its config is checked by Triton's generic rules (it
    was refused as 'a TensorRT engine needs platform tensorrt_plan'), and its version folder must hold that
    backend's model file (model.py for Python, model.onnx for onnxruntime)."""
    repo = tmp_path / "repo"
    assert cli("triton", _engine(tmp_path), "--repo", repo, "--name", "llama").code == 0
    (repo / "pre" / "1").mkdir(parents=True)
    (repo / "pre" / "config.pbtxt").write_text(
        'name: "pre"\nbackend: "python"\nmax_batch_size: 8\ninput { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }\n'
        'output { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }\ninstance_group [ { kind: KIND_CPU } ]\n')
    assert_one_line_error(cli("triton", "--check", repo), 1, f"{repo / 'pre' / '1' / 'model.py'}: missing")
    (repo / "pre" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    res = cli("triton", "--check", repo)
    assert res.code == 0 and "repo/pre is a valid" in res.out, res.err
