"""trtforge precision, round 4: models whose converted graph computed something else than the source, checked with
onnx.reference on models built here."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from trtforge.build_engine.precision.convert import convert_precision


def _overridable_weight_model(w: np.ndarray) -> onnx.ModelProto:
    """y = x @ w where w is a graph input with an initializer: a default the caller may override (IR >= 4)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("to", ["fp16", "bf16"])
def test_overridable_initializer_is_read_at_run_time(rng: np.random.Generator, to: str) -> None:
    """The initializer of graph input w was converted to a renamed constant (w__fp16) that the MatMul read, so a fed w
    was ignored (the default's product came out) and w lost its default; now w is cast at run time: a fed w gives
    x @ w_fed, an unfed one x @ default, both within the low type's rounding, and w keeps its float32 default."""
    default = rng.standard_normal((4, 4)).astype(np.float32)
    fed = (rng.standard_normal((4, 4)) * 3).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    out = convert_precision(_overridable_weight_model(default), to).model
    inits = {t.name: t for t in out.graph.initializer}
    assert inits["w"].data_type == TensorProto.FLOAT
    np.testing.assert_array_equal(numpy_helper.to_array(inits["w"]), default)
    assert [(vi.name, vi.type.tensor_type.elem_type) for vi in out.graph.input] == [("x", 1), ("w", 1)]
    ref = ReferenceEvaluator(out)
    tol = {"fp16": 2e-2, "bf16": 1e-1}[to]
    np.testing.assert_allclose(ref.run(None, {"x": x, "w": fed})[0], x @ fed, atol=tol * 4, rtol=tol)
    np.testing.assert_allclose(ref.run(None, {"x": x})[0], x @ default, atol=tol * 4, rtol=tol)


def test_overridable_initializer_beyond_fp16_keeps_its_consumer_fp32() -> None:
    """Rule 8 still reads such a default's range: a 1e5 in it keeps the MatMul in fp32 (no inf from a cast)."""
    default = np.eye(4, dtype=np.float32) * 1e5
    out = convert_precision(_overridable_weight_model(default), "fp16").model
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(ReferenceEvaluator(out).run(None, {"x": x})[0], x @ default)
    assert "MatMul" in [n.op_type for n in out.graph.node]
    assert all(n.op_type != "Cast" or n.input[0] != "w" for n in out.graph.node)


def _epsilon_model(eps: float) -> onnx.ModelProto:
    """y = m / sqrt(m * m2 + eps) with m = m2 = x @ I: 0 where x is 0 (fp32), the sign of x elsewhere (m * m2, two
    values, is a product the policy converts; Mul(m, m) is a square, kept fp32 like Pow)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("MatMul", ["x", "w"], ["m2"]),
         helper.make_node("Mul", ["m", "m2"], ["sq"]),
         helper.make_node("Add", ["sq", "eps"], ["se"]), helper.make_node("Sqrt", ["se"], ["r"]),
         helper.make_node("Div", ["m", "r"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
         numpy_helper.from_array(np.array(eps, np.float32), "eps")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_epsilon_fp16_rounds_to_zero_keeps_its_reader_fp32(rng: np.random.Generator) -> None:
    """An epsilon of 1e-12 became fp16 0, so m * m + eps added nothing and 0 / sqrt(0) gave NaN where fp32 gives 0;
    now the Add reading it stays fp32 (rule 10), the MatMul and Mul still run in fp16, and 1e-5 (an fp16 subnormal)
    converts as before."""
    x = rng.standard_normal((2, 4)).astype(np.float32)
    x[0, 1:] = 0.0
    want = ReferenceEvaluator(_epsilon_model(1e-12)).run(None, {"x": x})[0]
    res = convert_precision(_epsilon_model(1e-12), "fp16")
    got = ReferenceEvaluator(res.model).run(None, {"x": x})[0]
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, atol=2e-3)
    ops = {n.op_type: n for n in res.model.graph.node}
    add_inputs = set(ops["Add"].input)
    assert "eps" in add_inputs  # the fp32 constant itself, not an fp16 copy
    low = {vi.name: vi.type.tensor_type.elem_type for vi in res.model.graph.value_info}
    assert low.get(ops["Mul"].output[0]) == TensorProto.FLOAT16
    # bf16 keeps fp32's exponent range: nothing rounds to zero there, the Add converts
    bf = convert_precision(_epsilon_model(1e-12), "bf16").model
    assert "eps" not in {n for node in bf.graph.node if node.op_type == "Add" for n in node.input}
    sub = convert_precision(_epsilon_model(1e-5), "fp16").model  # representable: converted as before
    assert "eps" not in {n for node in sub.graph.node if node.op_type == "Add" for n in node.input}


def test_epsilon_as_a_double_literal_cast_to_float(rng: np.random.Generator) -> None:
    """The same epsilon written as exporters often do, Cast(Constant(float64 1e-12), to=float): the constant subgraph
    stayed fp32 but its fp16 reader got a Cast of it to 0 (NaN again); rule 10 now follows constant subgraphs."""
    model = _epsilon_model(1e-12)
    model.graph.initializer.pop()  # eps: now computed from a double literal
    model.graph.node.insert(0, helper.make_node("Cast", ["eps64"], ["eps"], to=TensorProto.FLOAT))
    model.graph.node.insert(0, helper.make_node("Constant", [], ["eps64"],
                                                value=numpy_helper.from_array(np.array(1e-12, np.float64))))
    x = rng.standard_normal((2, 4)).astype(np.float32)
    x[1, :2] = 0.0
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = ReferenceEvaluator(convert_precision(model, "fp16").model).run(None, {"x": x})[0]
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, atol=2e-3)


def test_bf16_of_an_opset_11_model_converts(rng: np.random.Generator) -> None:
    """Below opset 13 MatMul/Add/Softmax admit no bfloat16, so --to bf16 kept every node in float32 ('bf16, 0 nodes
    converted'; build for a100 made an fp32 engine); now the model is first converted to opset 13 (as quantize does),
    then to bf16, with the source's numbers within bf16 rounding (Unsqueeze's axes moved to an input on the way)."""
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Unsqueeze", ["m"], ["u"], axes=[0]),
         helper.make_node("Softmax", ["u"], ["s"], axis=-1), helper.make_node("Add", ["s", "u"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6)
    res = convert_precision(model, "bf16")
    out = res.model
    assert [o.version for o in out.opset_import if o.domain in ("", "ai.onnx")] == [13]
    onnx.checker.check_model(out, full_check=True)
    assert res.report.nodes_low >= 2  # MatMul and Add in bf16 (Softmax stays fp32 by policy)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(ReferenceEvaluator(out).run(None, {"x": x})[0], want, atol=5e-2, rtol=2e-2)
