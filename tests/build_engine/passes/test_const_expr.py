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


def _expanding_expression(kit, n: int):
    """``Cast(Reshape(Slice(ConstantOfShape([n, n]))))`` + x: a tiny model whose constant expression passes through an
    ``n * n``-element value (the Slice keeps 4 of them)."""
    i64 = {k: nh.from_array(np.array(v, np.int64), k) for k, v in
           (("sh", [n, n]), ("st", [0, 0]), ("en", [2, 2]), ("flat", [-1]))}
    nodes = [h.make_node("ConstantOfShape", ["sh"], ["z"], value=nh.from_array(np.array([1.5], np.float64))),
             h.make_node("Slice", ["z", "st", "en"], ["s"]), h.make_node("Reshape", ["s", "flat"], ["r"]),
             h.make_node("Cast", ["r"], ["c"], to=T.INT32), h.make_node("Add", ["c", "x"], ["y"])]
    return kit.make_model(nodes, [("x", T.INT32, [4])], [("y", T.INT32, [4])], list(i64.values()))


def test_expression_through_a_huge_intermediate_is_not_computed(kit, folded) -> None:
    # 2048 * 2048 elements > the 2**20 bound: refused before ConstantOfShape runs (at 10**5 * 10**5 the old
    # evaluation allocated 80 GB for a 300-byte model); the same expression below the bound still folds
    _, rep = folded(_expanding_expression(kit, 2048))
    assert "constant_expression" not in rep["rules"] and "constant_cast" not in rep["rules"]
    out, rep = folded(_expanding_expression(kit, 1024))
    assert rep["rules"]["constant_expression"] == 1 and kit.ops(out) == ["Add"]
    assert nh.to_array(out.graph.initializer[0]).tolist() == [1, 1, 1, 1]


def test_range_longer_than_the_bound_is_not_computed(kit, folded) -> None:
    i64 = [nh.from_array(np.array(v, np.int64), k) for k, v in (("a", 0), ("b", 2**24), ("d", 3), ("st", [0]),
                                                                ("en", [4]))]
    nodes = [h.make_node("Range", ["a", "b", "d"], ["z"]), h.make_node("Slice", ["z", "st", "en"], ["s"]),
             h.make_node("Cast", ["s"], ["c"], to=T.INT32), h.make_node("Add", ["c", "x"], ["y"])]
    m = kit.make_model(nodes, [("x", T.INT32, [4])], [("y", T.INT32, [4])], i64)
    _, rep = folded(m)
    assert "constant_expression" not in rep["rules"]
