"""Round-5 QA regressions for trtforge quantize (held-out numerics and report completeness)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.quantize import CalibSet, QuantConfig, quantize

H = 16


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def test_weights_given_by_constant_nodes_are_reported_when_kept_float(rng: np.random.Generator) -> None:
    # old: a Conv whose weight is a Constant node, and an If body's MatMul whose weight is a Constant node of the
    # body (as exporters write them), stayed float and the report listed neither (only initializers were seen)
    w = rng.standard_normal((H, H)).astype(np.float32)
    then = helper.make_graph([_constant("w_then", w), helper.make_node("MatMul", ["x", "w_then"], ["t"],
                                                                       name="then_mm")],
                             "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, H])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, H])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"], name="mm"),
             helper.make_node("If", ["c"], ["i"], then_branch=then, else_branch=other, name="if"),
             _constant("conv_w", rng.standard_normal((2, 1, 3, 3)).astype(np.float32)),
             helper.make_node("Reshape", ["x", "img_shape"], ["img"]),
             helper.make_node("Conv", ["img", "conv_w"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["p", "i"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([2, 1, 4, 4], np.int64), "img_shape")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, H]),
                                       helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, H]),
                           helper.make_tensor_value_info("conv", TensorProto.FLOAT, [2, 2, 4, 4])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    samples = tuple({"x": rng.standard_normal((2, H)).astype(np.float32), "c": np.array(flag)}
                    for flag in (True, False))
    report = quantize(model, QuantConfig(mode="int8"), CalibSet(samples, "test")).report
    assert [n.name for n in report.nodes] == ["mm"]
    reasons = {e.name: e.reason for e in report.excluded}
    assert sorted(reasons) == ["conv", "then_mm"]
    assert reasons["conv"].startswith("Conv is not quantized") and "stays float" in reasons["conv"]
    assert "inside the subgraph 'then'" in reasons["then_mm"]


def test_an_activation_empty_on_every_sample_is_one_clear_error(tmp_path, rng: np.random.Generator, cli) -> None:
    # old: a projection reading an input of fixed size [0, 16] ended in 'internal error: ValueError: zero-size array
    # to reduction operation maximum', exit 3, in every mode; now exit 2 naming the activation, nothing written
    from trtforge_testing import assert_one_line_error

    w = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["p"], name="proj"),
                           helper.make_node("Relu", ["p"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [0, H])], [w])
    src, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    for mode in ("int8", "int4-wo", "fp8"):
        res = cli("quantize", src, "-o", out, "--mode", mode, "--block-size", "16")
        assert_one_line_error(res, 2, "activation 'x' is empty", "every calibration sample")
        assert not out.exists()


def test_projections_inside_model_local_functions_are_reported(rng: np.random.Generator) -> None:
    # old: a MatMul inside a model-local function (its weight a Constant of the function, or an initializer the call
    # passes in) stayed float and the report listed neither (excluded was empty)
    w = rng.standard_normal((H, H)).astype(np.float32)
    own = helper.make_function("local", "Own", ["a"], ["b"], [_constant("wf", w), helper.make_node(
        "MatMul", ["a", "wf"], ["b"], name="own_mm")], [helper.make_opsetid("", 17)])
    given = helper.make_function("local", "Given", ["a", "wa"], ["b"], [helper.make_node(
        "MatMul", ["a", "wa"], ["b"], name="given_mm")], [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"], name="mm"),
             helper.make_node("Own", ["p"], ["q"], domain="local"),
             helper.make_node("Given", ["q", "w"], ["r"], domain="local"), helper.make_node("Relu", ["r"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, H])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[own, given])
    onnx.checker.check_model(model, full_check=True)
    samples = tuple({"x": rng.standard_normal((2, H)).astype(np.float32)} for _ in range(2))
    report = quantize(model, QuantConfig(mode="int8"), CalibSet(samples, "test")).report
    assert [n.name for n in report.nodes] == ["mm"]
    reasons = {e.name: e.reason for e in report.excluded}
    assert sorted(reasons) == ["given_mm", "own_mm"]
    assert "model-local function 'local.Own'" in reasons["own_mm"] and "stays float" in reasons["own_mm"]
    assert "model-local function 'local.Given'" in reasons["given_mm"]


def test_recurrent_layers_are_reported_as_kept_float(rng: np.random.Generator) -> None:
    # old: an LSTM and a GRU with float32 weight initializers stayed float and the report did not list them (it
    # promises every weighted layer kept float, with its reason)
    hidden = 8

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"], name="proj"),
             helper.make_node("LSTM", ["p", "lw", "lr", "lb"], ["yl"], hidden_size=hidden, name="lstm"),
             helper.make_node("GRU", ["p", "gw", "gr"], ["yg"], hidden_size=hidden, name="gru")]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w(H, H), "w"), (w(1, 4 * hidden, H), "lw"),
                                                        (w(1, 4 * hidden, hidden), "lr"), (w(1, 8 * hidden), "lb"),
                                                        (w(1, 3 * hidden, H), "gw"), (w(1, 3 * hidden, hidden), "gr"))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 2, H])],
                          [helper.make_tensor_value_info("yl", TensorProto.FLOAT, [5, 1, 2, hidden]),
                           helper.make_tensor_value_info("yg", TensorProto.FLOAT, [5, 1, 2, hidden])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    samples = tuple({"x": rng.standard_normal((5, 2, H)).astype(np.float32)} for _ in range(2))
    result = quantize(model, QuantConfig(mode="int8"), CalibSet(samples, "test"))
    assert [n.name for n in result.report.nodes] == ["proj"]
    reasons = {e.name: e.reason for e in result.report.excluded}
    assert sorted(reasons) == ["gru", "lstm"]
    assert reasons["lstm"].startswith("LSTM is not quantized") and reasons["gru"].startswith("GRU is not quantized")
    kept = {t.name for t in result.model.graph.initializer if t.data_type == TensorProto.FLOAT}
    assert {"lw", "lr", "lb", "gw", "gr"} <= kept


def test_weights_computed_from_constant_nodes_are_reported(rng: np.random.Generator) -> None:
    # old: a MatMul reading Transpose(Constant W) (a tied head an exporter wrote without constant folding) and one
    # computing Constant W @ x stayed float and the report listed neither (only initializers were seen there)
    w = rng.standard_normal((H, H)).astype(np.float32)
    nodes = [_constant("wt", w), helper.make_node("Transpose", ["wt"], ["w_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "w_t"], ["p"], name="transposed"),
             _constant("wl", w), helper.make_node("MatMul", ["wl", "p"], ["q"], name="left"),
             helper.make_node("MatMul", ["q", "w"], ["r"], name="proj"), helper.make_node("Relu", ["r"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [H, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [H, H])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    samples = tuple({"x": rng.standard_normal((H, H)).astype(np.float32)} for _ in range(2))
    report = quantize(model, QuantConfig(mode="int8"), CalibSet(samples, "test")).report
    assert [n.name for n in report.nodes] == ["proj"]
    reasons = {e.name: e.reason for e in report.excluded}
    assert sorted(reasons) == ["left", "transposed"]
    assert reasons["transposed"].startswith("its weight is computed at run time (Transpose of 'wt')")
    assert reasons["left"].startswith("its constant is the first input (W @ x)")


def test_exclude_may_name_a_layer_the_report_lists_inside_a_body(rng: np.random.Generator) -> None:
    # old: --exclude then_mm, a name the report lists as kept float (inside an If body), was refused as
    # "--exclude 'then_mm' matches no node name" (exit 2): only main-graph names were searched
    from trtforge.build_engine.core.errors import InputError

    w = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "w")
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"], name="then_mm")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, H])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, H])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"], name="mm"),
             helper.make_node("If", ["c"], ["i"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["p", "i"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, H]),
                                       helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, H])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    samples = tuple({"x": rng.standard_normal((2, H)).astype(np.float32), "c": np.array(flag)}
                    for flag in (True, False))
    report = quantize(model, QuantConfig(mode="int8", exclude=("then_mm",)), CalibSet(samples, "test")).report
    assert [n.name for n in report.nodes] == ["mm"] and [e.name for e in report.excluded] == ["then_mm"]
    for typo in ("thenmm", "then_mm*x"):  # a typo is still refused
        with pytest.raises(InputError, match="matches no node name"):
            quantize(model, QuantConfig(mode="int8", exclude=(typo,)), CalibSet(samples, "test"))
