"""A constant expression feeding a Cast is evaluated (onnx.reference) when every op in it is exactly specified."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def _const(name: str, value: np.ndarray):
    return h.make_node("Constant", [], [name], value=nh.from_array(value))


def test_integer_expression_into_cast_is_folded(kit, folded) -> None:
    c1 = nh.from_array(np.array([3, 5, 7], np.int64), "c1")
    nodes = [_const("k", np.array(2, np.int64)), h.make_node("Mul", ["c1", "k"], ["m"]),
             h.make_node("Add", ["m", "k"], ["a"]), h.make_node("Cast", ["a"], ["af"], to=T.FLOAT),
             h.make_node("Add", ["x", "af"], ["y"])]
    m = kit.make_model(nodes, [("x", T.FLOAT, [3])], [("y", T.FLOAT, [3])], [c1])
    out, rep = folded(m)
    assert kit.ops(out) == ["Add"] and rep["rules"]["constant_expression"] == 1
    assert rep["removed"] == {"Add": 1, "Cast": 1, "Constant": 1, "Mul": 1}
    assert nh.to_array(out.graph.initializer[0]).tolist() == [8.0, 12.0, 16.0]


def test_float_division_and_sqrt_are_exact_and_folded(kit, folded) -> None:
    nodes = [_const("a", np.array([2.0, 3.0, 1e-40], np.float32)), _const("b", np.array([3.0, 7.0, 3.0], np.float32)),
             h.make_node("Div", ["a", "b"], ["q"]), h.make_node("Sqrt", ["q"], ["s"]),
             h.make_node("Cast", ["s"], ["s16"], to=T.DOUBLE), h.make_node("Cast", ["x"], ["x64"], to=T.DOUBLE),
             h.make_node("Mul", ["x64", "s16"], ["y"])]
    m = kit.make_model(nodes, [("x", T.FLOAT, [3])], [("y", T.DOUBLE, [3])])
    out, rep = folded(m)
    assert rep["rules"].get("constant_expression") == 1 and "Div" not in kit.ops(out)


def test_transcendental_or_input_dependent_expressions_stay(kit, folded) -> None:
    nodes = [_const("a", np.array([0.5, 1.5], np.float32)), h.make_node("Exp", ["a"], ["e"]),
             h.make_node("Cast", ["e"], ["e64"], to=T.DOUBLE), h.make_node("Add", ["x", "a"], ["xa"]),
             h.make_node("Cast", ["xa"], ["y2"], to=T.DOUBLE), h.make_node("Add", ["e64", "y2"], ["y"])]
    m = kit.make_model(nodes, [("x", T.FLOAT, [2])], [("y", T.DOUBLE, [2])])
    out, rep = folded(m)
    assert "constant_expression" not in rep["rules"] and kit.ops(out).count("Cast") == 2


def test_out_of_range_float_to_int_is_left_to_the_runtime(kit, folded) -> None:
    nodes = [_const("a", np.array([3e9, 1.0], np.float32)), _const("b", np.array([1.0, 2.0], np.float32)),
             h.make_node("Mul", ["a", "b"], ["p"]), h.make_node("Cast", ["p"], ["pi"], to=T.INT32),
             h.make_node("Add", ["x", "pi"], ["y"])]
    m = kit.make_model(nodes, [("x", T.INT32, [2])], [("y", T.INT32, [2])])
    out, rep = folded(m)
    assert "constant_expression" not in rep["rules"] and "Mul" in kit.ops(out)
