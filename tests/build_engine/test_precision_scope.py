"""Precision conversion keeps what subgraphs read from the outer scope, and drops tied-weight aliases it made dead."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.precision.convert import convert_precision
from trtforge.examples.llama import make_llama


def _if_model(w: np.ndarray) -> onnx.ModelProto:
    """y = If(c, then: x @ w, else: x); ``w`` is an initializer read only inside the then-branch."""
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [],
                              [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 4])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 4])])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("to", ["fp16", "bf16"])
def test_initializer_read_only_by_a_subgraph_is_kept(to: str, rng: np.random.Generator) -> None:
    from onnx.reference import ReferenceEvaluator

    w = rng.standard_normal((4, 4)).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    converted = convert_precision(_if_model(w), to).model
    assert "w" in {t.name for t in converted.graph.initializer}
    (y,) = ReferenceEvaluator(converted).run(None, {"x": x, "c": np.array(True)})
    # Subgraph ops stay fp32 and untouched, so the branch computes exactly what the fp32 model does.
    (expected,) = ReferenceEvaluator(_if_model(w)).run(None, {"x": x, "c": np.array(True)})
    np.testing.assert_array_equal(y, expected)


def test_tied_weight_alias_is_dropped_when_all_consumers_read_the_converted_copy() -> None:
    model = make_llama()
    weights = {t.name for t in model.graph.initializer}
    matmul_inputs = {x for n in model.graph.node if n.op_type == "MatMul" for x in n.input}
    # Identity aliases of a weight feeding a projection (converted); norm weights' aliases feed fp32 ops and stay.
    aliases = [n for n in model.graph.node
               if n.op_type == "Identity" and n.input[0] in weights and n.output[0] in matmul_inputs]
    assert aliases, "the example Llama ties lm_head through an Identity of the weight"
    converted = convert_precision(model, "bf16", fold=False).model
    inits = {t.name: t for t in converted.graph.initializer}
    for alias in aliases:
        assert alias.name not in {n.name for n in converted.graph.node}
        assert alias.input[0] not in inits  # no fp32 copy of the tied weight is carried along
        consumers = [n.name for n in model.graph.node if alias.output[0] in n.input]
        for node in converted.graph.node:
            if node.name in consumers:  # now reads a converted bf16 copy of the weight
                assert any(x in inits and inits[x].data_type == TensorProto.BFLOAT16 for x in node.input)
