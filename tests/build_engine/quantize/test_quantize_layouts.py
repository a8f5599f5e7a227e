"""Held-out projection layouts and input kinds for trtforge quantize (models built here, fresh random weights):
initializers the rewrite must keep (a weight that is also a graph output, a constant an If body captures) and
rank-0 inputs in generated and file calibration samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import CliResult

K, N, ROWS = 64, 48, 5


def _save(tmp_path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: dict[str, np.ndarray]) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "src.onnx"
    onnx.save(model, path)
    return path


def _session(path: Path) -> object:
    from trtforge.build_engine.verify.sessions import make_session

    return make_session(str(path))


def _weight(rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)


@pytest.mark.parametrize("mode", ["int8", "int4-wo", "fp8"])
def test_weight_that_is_a_graph_output_is_kept(mode: str, cli, tmp_path: Path, rng: np.random.Generator) -> None:
    """The MatMul is quantized; the graph output ``w`` still holds the float weight (it was dropped: the model
    failed onnx.checker, "Graph output 'w' is not an output of any node")."""
    w = _weight(rng)
    src = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Relu", ["h"], ["y"])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, K])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, N]),
                 helper.make_tensor_value_info("w", TensorProto.FLOAT, [K, N])], {"w": w})
    out = tmp_path / "q.onnx"
    res: CliResult = cli("quantize", src, "-o", out, "--mode", mode, "--calib-size", "2", "--block-size", "16")
    assert res.code == 0, res.err
    q = onnx.load(out)
    onnx.checker.check_model(q, full_check=True)
    assert next(n for n in q.graph.node if n.name == "mm").input[1] != "w"  # quantized
    x = rng.uniform(0, 1, (ROWS, K)).astype(np.float32)
    y, w_out = _session(out).run(None, {"x": x})  # type: ignore[attr-defined]
    assert w_out.tobytes() == w.tobytes()
    ref = np.maximum(x.astype(np.float64) @ w, 0)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 0.2


@pytest.mark.parametrize("calib", ["generated", "file"])
def test_initializer_read_by_an_if_body_and_a_scalar_bool_input(calib: str, cli, tmp_path: Path,
                                                                rng: np.random.Generator) -> None:
    """``c`` is read only inside the If's then-branch (outer-scope capture): the rewrite dropped it (the model
    failed onnx.checker). ``cond`` is a rank-0 bool input: its generated sample (a 0-d comparison) and sample k of
    a stacked file were NumPy scalars, which onnxruntime refuses ("Unable to handle object of type numpy.bool"),
    so quantize exited 2 blaming the calibration inputs' shapes."""
    c = rng.standard_normal(N).astype(np.float32)
    then_g = helper.make_graph([helper.make_node("Add", ["r", "c"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [ROWS, N])])
    else_g = helper.make_graph([helper.make_node("Identity", ["r"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [ROWS, N])])
    src = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Relu", ["h"], ["r"]),
                           helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, K]),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, N])], {"w": _weight(rng), "c": c})
    extra: list[str | Path] = ["--calib-size", "3"]
    if calib == "file":
        np.savez(tmp_path / "c.npz", x=rng.uniform(0, 1, (3, ROWS, K)).astype(np.float32),
                 cond=np.array([True, False, True]))
        extra = ["--calib", tmp_path / "c.npz"]
    out = tmp_path / "q.onnx"
    res = cli("quantize", src, "-o", out, "--mode", "int8", *extra)
    assert res.code == 0, res.err
    onnx.checker.check_model(onnx.load(out), full_check=True)
    x = rng.uniform(0, 1, (ROWS, K)).astype(np.float32)
    sess, ref = _session(out), _session(src)
    with_c = sess.run(None, {"x": x, "cond": np.array(True)})[0]  # type: ignore[attr-defined]
    without = sess.run(None, {"x": x, "cond": np.array(False)})[0]  # type: ignore[attr-defined]
    np.testing.assert_allclose(with_c - without, np.broadcast_to(c, (ROWS, N)), atol=1e-5)
    y_ref = ref.run(None, {"x": x, "cond": np.array(False)})[0]  # type: ignore[attr-defined]
    assert 0 < np.linalg.norm(without - y_ref) / np.linalg.norm(y_ref) < 0.1
