"""Held-out build inputs (QA session 24): several inputs/outputs of int64/bool/fp16 types, names with '/', ':',
spaces and unicode, an initializer passed straight to an output, a graph input passed straight to an output
(refused: TensorRT renames it), and a dynamic dim named neither batch nor sequence (the message names the file)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge_testing import assert_one_line_error

X, OUT = "in/x:0", "out relu/ü"


def _vi(name: str, t: int, shape: list) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, t, shape)


def _multi(passthrough: bool = False) -> onnx.ModelProto:
    nodes = [h.make_node("Relu", [X], [OUT]),
             h.make_node("Cast", ["ids"], ["idsf"], to=T.FLOAT),
             h.make_node("Where", ["m", "idsf", "idsf"], ["w"]),
             h.make_node("ReduceSum", ["w"], ["rs"], keepdims=1),
             h.make_node("Cast", ["z16"], ["z32"], to=T.FLOAT),
             h.make_node("Add", ["z32", "W"], ["zo"]),
             h.make_node("Not", ["m"], ["notm"])]
    outputs = [_vi(OUT, T.FLOAT, ["batch", 4]), _vi("rs", T.FLOAT, [1, 1]), _vi("zo", T.FLOAT, ["batch", 4]),
               _vi("notm", T.BOOL, ["batch", "sequence"]), _vi("C", T.FLOAT, [3])]
    if passthrough:
        outputs.append(_vi("ids", T.INT64, ["batch", "sequence"]))
    graph = h.make_graph(
        nodes, "heldout",
        [_vi(X, T.FLOAT, ["batch", 4]), _vi("ids", T.INT64, ["batch", "sequence"]),
         _vi("m", T.BOOL, ["batch", "sequence"]), _vi("z16", T.FLOAT16, ["batch", 4])],
        outputs, [nh.from_array(np.ones(4, np.float32), "W"), nh.from_array(np.arange(3, dtype=np.float32), "C")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtforge.build_engine.engine.builder import build_engine

    d = tmp_path_factory.mktemp("heldout")
    onnx.save(_multi(), d / "multi.onnx")
    build_engine(d / "multi.onnx", "a10", d / "e", progress=False)
    return d / "e"


def test_passthrough_input_output_is_refused(cli, tmp_path: Path) -> None:
    """Was exit 1 'Dynamic input tensor __ids is missing dimensions in profile 0' from TensorRT's build."""
    path = tmp_path / "pass.onnx"
    onnx.save(_multi(passthrough=True), path)
    res = cli("build", path, "--profile", "a10", "-o", tmp_path / "e", "--no-progress")
    assert_one_line_error(res, 2, str(path), "'ids'", "graph output")
    assert not (tmp_path / "e").exists()


def test_unnamed_axis_error_names_the_file(cli, tmp_path: Path) -> None:
    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [_vi("x", T.FLOAT, ["batch", "height", 3])],
                         [_vi("y", T.FLOAT, ["batch", "height", 3])])
    path = tmp_path / "height.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    res = cli("build", path, "--profile", "a10", "-o", tmp_path / "e")
    assert_one_line_error(res, 2, str(path), "'x'", "height", "'batch' or 'sequence'")


def test_manifest_bindings(engine: Path) -> None:
    m = json.loads((engine / "manifest.json").read_text())
    assert [(t["name"], t["dtype"], t["shape"]) for t in m["inputs"]] == [
        (X, "float32", [-1, 4]), ("ids", "int64", [-1, -1]), ("m", "bool", [-1, -1]), ("z16", "float16", [-1, 4])]
    assert [(t["name"], t["dtype"], t["shape"]) for t in m["outputs"]] == [
        (OUT, "float32", [-1, 4]), ("rs", "float32", [1, 1]), ("zo", "float32", [-1, 4]),
        ("notm", "bool", [-1, -1]), ("C", "float32", [3])]


def test_triton_config_matches_bindings(cli, engine: Path, tmp_path: Path) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    res = cli("triton", engine, "--repo", tmp_path / "repo", "--name", "multi", "--warmup")
    assert res.code == 0, res.err
    cfg = text_format.Parse((tmp_path / "repo/multi/config.pbtxt").read_text(), pb.ModelConfig())
    assert cfg.max_batch_size == 0  # 'rs' and 'C' have no leading dynamic batch dim
    assert [(t.name, pb.DataType.Name(t.data_type), list(t.dims)) for t in cfg.input] == [
        (X, "TYPE_FP32", [-1, 4]), ("ids", "TYPE_INT64", [-1, -1]), ("m", "TYPE_BOOL", [-1, -1]),
        ("z16", "TYPE_FP16", [-1, 4])]
    assert [pb.DataType.Name(t.data_type) for t in cfg.output] == ["TYPE_FP32"] * 3 + ["TYPE_BOOL", "TYPE_FP32"]
    assert cli("triton", "--check", tmp_path / "repo/multi").code == 0


_CORRUPT = {  # tritonserver 2.51 refuses each while reading the repository; --check passed bad_pair
    "bad_pair": lambda t: t.replace('platform: "tensorrt_plan"', 'platform: "tensorrt_plan"\nbackend: "onnxruntime"'),
    "zero_dim": lambda t: t.replace("dims: 1\n  dims: 1\n", "dims: 1\n  dims: 0\n", 1),
    "bad_dim": lambda t: t.replace("dims: 4\n}\ninput", "dims: -2\n}\ninput", 1),
}


def test_check_refuses_what_tritonserver_refuses(cli, engine: Path, tmp_path: Path) -> None:
    import shutil

    repo = tmp_path / "repo"
    assert cli("triton", engine, "--repo", repo, "--name", "good").code == 0
    for name, fn in _CORRUPT.items():
        shutil.copytree(repo / "good", repo / name)
        cfg = repo / name / "config.pbtxt"
        text = cfg.read_text().replace('name: "good"', f'name: "{name}"')
        assert fn(text) != text, name
        cfg.write_text(fn(text))
        res = cli("triton", "--check", repo / name)
        assert res.code == 1 and f"{repo / name}/config.pbtxt:" in res.err, (name, res.err)
    assert cli("triton", "--check", repo / "good").code == 0

    from tritonserver_testing import run_server, server_dir

    if server_dir() is None:
        return  # nvidia-pytriton not installed: --check's verdicts above stand alone
    run = run_server(repo, tmp_path / "server.log")
    assert "unable to find backend library for backend 'tensorrt'" in run.reason("good"), run.index
    for name in _CORRUPT:
        assert "backend library" not in run.reason(name) and f"'{name}'" in run.log, (name, run.index.get(name))


@pytest.mark.parametrize("opset,claim", [(17, "fp32"), (22, "bf16")])
def test_manifest_precision_says_fp32_when_nothing_runs_in_bf16(tmp_path: Path, cli, opset: int, claim: str) -> None:
    """Conv -> BatchNormalization -> Conv at opset 17 for the a100 (bf16) profile: Conv admits bf16 only from opset
    22, so every tensor stays float32, yet manifest.json (and the build's summary line) said "bf16"."""
    pytest.importorskip("tensorrt_rtx")
    rng = np.random.default_rng(17)
    w = [nh.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
         for n, s in (("w1", (4, 3, 1, 1)), ("w2", (2, 4, 1, 1)))]
    stats = [nh.from_array(np.full(4, v, np.float32), n)
             for n, v in (("sc", 1.0), ("bi", 0.0), ("mu", 0.0), ("va", 1.0))]
    nodes = [h.make_node("Conv", ["x", "w1"], ["a"]),
             h.make_node("BatchNormalization", ["a", "sc", "bi", "mu", "va"], ["bn"]),
             h.make_node("Conv", ["bn", "w2"], ["y"])]
    graph = h.make_graph(nodes, "conv", [_vi("x", T.FLOAT, ["batch", 3, 4, 4])],
                         [_vi("y", T.FLOAT, ["batch", 2, 4, 4])], [*w, *stats])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, tmp_path / "conv.onnx")
    res = cli("build", tmp_path / "conv.onnx", "--profile", "a100", "-o", tmp_path / "e", "--no-progress")
    assert res.code == 0, res.err
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    built = onnx.load(tmp_path / "e" / "model.onnx")
    has_bf16 = any(t.data_type == T.BFLOAT16 for t in built.graph.initializer)
    assert manifest["precision"] == claim and has_bf16 == (claim == "bf16"), (manifest["precision"], has_bf16)
    assert f", {claim}, " in res.out


def test_shape_tensor_input_refused_naming_it(tmp_path: Path, cli) -> None:
    """An int64 input used as Reshape's shape is a TensorRT shape tensor: the build failed with exit 1 and TensorRT's
    "Optimization profile 0 is missing values for shape input tensor shape"; now exit 2 naming the input and the fix."""
    pytest.importorskip("tensorrt_rtx")
    graph = h.make_graph([h.make_node("Reshape", ["x", "target"], ["r"]), h.make_node("Relu", ["r"], ["y"])], "st",
                         [_vi("x", T.FLOAT, ["batch", 8]), _vi("target", T.INT64, [2])],
                         [_vi("y", T.FLOAT, ["a", "b"])])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "st.onnx")
    res = cli("build", tmp_path / "st.onnx", "--profile", "a10", "-o", tmp_path / "e", "--no-progress")
    assert_one_line_error(res, 2, "st.onnx", "'target'", "shape tensors", "make them constants")
    assert not (tmp_path / "e").exists()


def test_already_16bit_model_failing_to_parse_gives_one_error_line(tmp_path: Path, cli) -> None:
    """An fp16 model for the bf16 a100 profile logged 'note: ... is already fp16; building it as is' on stderr before
    the parse error, so a failing build wrote two lines there instead of the one 'error:' line."""
    pytest.importorskip("tensorrt_rtx")
    graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["a"]),
                          h.make_node("Mystery", ["a"], ["y"], domain="example.unknown")], "g",
                         [_vi("x", T.FLOAT16, ["batch", 8])], [_vi("y", T.FLOAT16, ["batch", 8])],
                         [nh.from_array(np.eye(8, dtype=np.float16), "w")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("example.unknown", 1)])
    onnx.save(model, tmp_path / "f16.onnx")
    res = cli("build", tmp_path / "f16.onnx", "--profile", "a100", "-o", tmp_path / "e", "--no-progress")
    assert_one_line_error(res, 2, "cannot parse", "Mystery")
