"""Round-4 QA regressions for LoRA inject / pack."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.quantize import CalibSet, QuantConfig, quantize
from trtforge.plugins.lora.inject import inject

H = 32


def _named_like_dynamo(rng: np.random.Generator) -> onnx.ModelProto:
    """q_proj a MatMul, v_proj a transB Gemm (2-D Linear), nodes named node_linear_N with no module metadata: the
    module path comes from the weight names only."""
    q = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "layers.0.q_proj.weight")
    v = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "layers.0.v_proj.weight")
    nodes = [helper.make_node("MatMul", ["x", q.name], ["q"], name="node_linear_1"),
             helper.make_node("Gemm", ["x", v.name], ["v"], name="node_linear_2", transB=1),
             helper.make_node("Add", ["q", "v"], ["y"], name="node_add_3")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", H])], [q, v])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mode", ["int8", "fp8", "int4-wo"])
def test_quantize_then_inject_finds_modules_by_weight_name(mode: str, rng: np.random.Generator) -> None:
    # old: the quantized weight '<path>.weight_quantized' behind its DequantizeLinear was no '.weight' name, so the
    # module path fell back to the node name and '--targets q_proj' matched nothing after quantize
    model = _named_like_dynamo(rng)
    calib = CalibSet(tuple({"x": rng.standard_normal((8, H)).astype(np.float32)} for _ in range(3)), "test")
    quantized = quantize(model, QuantConfig(mode=mode, block_size=16), calib).model
    want = [i.name for i in inject(model, ["q_proj", "v_proj"], 4, 2).graph.input]
    got = [i.name for i in inject(quantized, ["q_proj", "v_proj"], 4, 2).graph.input]
    assert got == want
    assert "lora_a.layers.0.v_proj" in got and "lora_a.layers.0.q_proj" in got
