"""trtforge triton, round 7: an engine whose output is sequence-first (``[seq, batch, H]``, here by a Transpose) has
-1 first in every tensor, so the manifest alone made it a batching config (max_batch_size 8, dynamic batching), and
Triton would have split the output's sequence rows between the batched requests. The engine folder's model.onnx
names that dimension: such an engine gets max_batch_size 0, and --max-batch above 0 is refused naming the output.
An output of shape [batch, 0] is refused as bad input (exit 2), not as an invalid generated config. Real
TensorRT-RTX builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error, seeded_rng

pytest.importorskip("tritonclient.grpc.model_config_pb2")


def _model(path: Path, seq_first: bool) -> Path:
    """y = (x + w) [batch, seq, 4], and with ``seq_first`` also t = transpose(y) [seq, batch, 4]."""
    w = seeded_rng("test_triton_r7.model").uniform(-1.0, 1.0, (4,)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])]
    if seq_first:
        nodes.append(helper.make_node("Transpose", ["y"], ["t"], perm=[1, 0, 2]))
        outputs.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, ["seq", "batch", 4]))
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
                              outputs, [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("tensorrt_rtx")
    from trtforge.build_engine.cli import main

    d = tmp_path_factory.mktemp("triton_r7")
    out = {}
    for kind in ("seq_first", "batch_first"):
        src = _model(d / f"{kind}.onnx", kind == "seq_first")
        assert main(["build", str(src), "--profile", "a10", "-o", str(d / kind), "--no-progress"]) == 0
        out[kind] = d / kind
    return out


def _config(entry: Path):  # type: ignore[no-untyped-def]
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    return text_format.Parse((entry / "config.pbtxt").read_text(), pb.ModelConfig())


def test_sequence_first_output_gets_no_triton_batching(engines: dict[str, Path], tmp_path: Path, cli) -> None:
    repo = tmp_path / "repo"
    assert cli("triton", engines["seq_first"], "--repo", repo, "--name", "m").code == 0
    cfg = _config(repo / "m")
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    assert {t.name: list(t.dims) for t in cfg.output} == {"y": [-1, -1, 4], "t": [-1, -1, 4]}
    assert [list(t.dims) for t in cfg.input] == [[-1, -1, 4]]
    assert all(w.batch_size == 1 for w in cfg.model_warmup)
    assert cli("triton", "--check", repo / "m").code == 0
    res = cli("triton", engines["seq_first"], "--repo", tmp_path / "repo2", "--name", "m", "--max-batch", "4")
    assert_one_line_error(res, 2, "--max-batch 4", "output(s) t", "--max-batch 0")
    assert not (tmp_path / "repo2").exists()


def test_batch_first_outputs_keep_triton_batching(engines: dict[str, Path], tmp_path: Path, cli) -> None:
    repo = tmp_path / "repo"
    assert cli("triton", engines["batch_first"], "--repo", repo, "--name", "m").code == 0
    cfg = _config(repo / "m")
    assert cfg.max_batch_size == 8 and cfg.HasField("dynamic_batching")
    assert [list(t.dims) for t in cfg.output] == [[-1, 4]]


def test_empty_output_is_bad_input_not_an_invalid_generated_config(tmp_path: Path, cli) -> None:
    """An output of shape [batch, 0] (an empty Slice) builds; tritonserver refuses dims of 0, and trtforge triton
    failed with 'generated config.pbtxt is invalid' (exit 1, the message for a trtforge bug): now exit 2 naming the
    tensor and the fix, and no repository is made."""
    pytest.importorskip("tensorrt_rtx")
    w = seeded_rng("test_triton_r7.empty").uniform(-1.0, 1.0, (4,)).astype(np.float32)
    ints = {"s": [0], "e": [0], "a": [1]}
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "s", "e", "a"], ["none"]), helper.make_node("Add", ["x", "w"], ["y"])], "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("none", TensorProto.FLOAT, ["batch", 0]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(w, "w"),
         *(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items())])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    assert cli("build", tmp_path / "m.onnx", "--profile", "a10", "-o", tmp_path / "e", "--no-progress").code == 0
    res = cli("triton", tmp_path / "e", "--repo", tmp_path / "repo", "--name", "m")
    assert_one_line_error(res, 2, "outputs[0] (none)", "[-1, 0]", "rebuild the engine")
    assert not (tmp_path / "repo").exists()
