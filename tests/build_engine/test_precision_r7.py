"""trtforge precision, round 7: ops whose output type an attribute sets (``dtype`` of EyeLike, RandomNormal(Like),
RandomUniform(Like), Bernoulli; RandomNormal's float32 default) next to a converted projection: the converted model
must be valid ONNX that onnxruntime runs, and EyeLike's (deterministic) result must match the fp32 source."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.precision.convert import convert_precision
from trtforge_testing import seeded_rng

K = 16


def _model(rng: np.random.Generator, made: onnx.NodeProto, opset: int = 17) -> onnx.ModelProto:
    """y = (x @ w) + e, where ``made`` computes e [K, K] float32 (from ``a = x @ w`` or from nothing)."""
    w = numpy_helper.from_array(rng.standard_normal((K, K)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), made, helper.make_node("Add", ["a", "e"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [K, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [K, K])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


MADE = {
    "eyelike": lambda: helper.make_node("EyeLike", ["a"], ["e"], dtype=TensorProto.FLOAT, k=1),
    "random_uniform_like": lambda: helper.make_node("RandomUniformLike", ["a"], ["e"], dtype=TensorProto.FLOAT,
                                                    low=0.0, high=1e-3, seed=3.0),
    "random_normal_default": lambda: helper.make_node("RandomNormal", [], ["e"], shape=[K, K], scale=1e-3,
                                                      seed=3.0),
    "bernoulli": lambda: helper.make_node("Bernoulli", ["a"], ["e"], dtype=TensorProto.FLOAT, seed=3.0),
}


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"x": x})[0])


@pytest.mark.parametrize("kind", sorted(MADE))
def test_dtype_attribute_ops_convert_to_a_valid_fp16_model(kind: str) -> None:
    rng = seeded_rng(f"precision-r7-{kind}")
    model = _model(rng, MADE[kind]())
    out = convert_precision(model, "fp16").model
    onnx.checker.check_model(out, full_check=True)
    matmul = next(n for n in out.graph.node if n.op_type == "MatMul")
    assert any(t.name == matmul.input[1] and t.data_type == TensorProto.FLOAT16 for t in out.graph.initializer)
    x = rng.uniform(0.0, 1.0, (K, K)).astype(np.float32)
    y = _run(out, x)
    assert y.dtype == np.float32 and np.all(np.isfinite(y))
    if kind == "eyelike":  # deterministic: the fp32 source's result within fp16 rounding
        np.testing.assert_allclose(y, _run(model, x), atol=2e-2, rtol=2e-3)
