"""CastLike with a target of known type becomes the Cast it denotes, and the Cast rules then fold it exactly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return nh.from_array(value, name)


def test_same_type_cast_like_of_a_graph_input_is_removed(kit, folded) -> None:
    nodes = [h.make_node("CastLike", ["x", "t"], ["c"]), h.make_node("Add", ["c", "x"], ["y"])]
    m = kit.make_model(nodes, [("x", T.INT64, [4])], [("y", T.INT64, [4])], [_init("t", np.array([7], np.int64))])
    out, rep = folded(m)
    assert kit.ops(out) == ["Add"]
    assert rep["rules"]["cast_like_to_cast"] == 1 and rep["removed"]["CastLike"] == 1


def test_exact_round_trip_through_cast_like_is_removed(kit, folded) -> None:
    nodes = [h.make_node("CastLike", ["x", "t64"], ["wide"]), h.make_node("Cast", ["wide"], ["back"], to=T.FLOAT),
             h.make_node("Relu", ["back"], ["y"])]
    m = kit.make_model(nodes, [("x", T.FLOAT, [5])], [("y", T.FLOAT, [5])],
                       [_init("t64", np.array(0.25, np.float64))])
    out, rep = folded(m)
    assert kit.ops(out) == ["Relu"]


def test_lossy_round_trip_through_cast_like_stays(kit, folded) -> None:
    nodes = [h.make_node("CastLike", ["x", "t16"], ["half"]), h.make_node("Cast", ["half"], ["y"], to=T.FLOAT)]
    m = kit.make_model(nodes, [("x", T.FLOAT, [6])], [("y", T.FLOAT, [6])],
                       [_init("t16", np.array([1.5], np.float16))])
    out, _ = folded(m)
    casts = [n for n in out.graph.node if n.op_type == "Cast"]
    assert [n.attribute[0].i for n in casts] == [T.FLOAT16, T.FLOAT]


def test_saturate_is_kept_on_the_cast(kit, folded) -> None:
    """CastLike(saturate=0) to float8e4m3fn turns an out-of-range value into NaN, not the largest float8: the Cast
    keeps the attribute (the outputs are compared bit for bit on inputs with infinities and large values)."""
    nodes = [h.make_node("CastLike", ["x", "t8"], ["f8"], saturate=0), h.make_node("Cast", ["f8"], ["y"], to=T.FLOAT)]
    t8 = onnx.helper.make_tensor("t8", T.FLOAT8E4M3FN, [1], [1.0])
    m = kit.make_model(nodes, [("x", T.FLOAT, [8])], [("y", T.FLOAT, [8])], [t8])
    out, _ = folded(m)
    (cast,) = [n for n in out.graph.node if n.op_type == "Cast" and n.output[0] == "f8"]
    assert {a.name: a.i for a in cast.attribute} == {"to": T.FLOAT8E4M3FN, "saturate": 0}


def test_cast_like_in_a_constant_expression_lets_the_cast_fold(kit, folded) -> None:
    """The dynamo exporter's ``arange``: Range(CastLike(start, end), end, CastLike(step, end)) then a Cast; the
    whole expression is a constant once the CastLikes are Casts."""
    nodes = [h.make_node("Constant", [], ["start"], value=nh.from_array(np.array(0, np.int64))),
             h.make_node("Constant", [], ["end"], value=nh.from_array(np.array(6, np.int64))),
             h.make_node("Constant", [], ["step"], value=nh.from_array(np.array(1, np.int64))),
             h.make_node("CastLike", ["start", "end"], ["s"]), h.make_node("CastLike", ["step", "end"], ["d"]),
             h.make_node("Range", ["s", "end", "d"], ["r"]), h.make_node("Cast", ["r"], ["rf"], to=T.FLOAT),
             h.make_node("Add", ["x", "rf"], ["y"])]
    m = kit.make_model(nodes, [("x", T.FLOAT, [6])], [("y", T.FLOAT, [6])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Add"]
    assert nh.to_array(out.graph.initializer[0]).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("opset", [15, 19, 21])
def test_every_opset_with_cast_like_gives_identical_outputs(kit, folded, opset: int) -> None:
    nodes = [h.make_node("CastLike", ["x", "ti"], ["xi"]), h.make_node("CastLike", ["xi", "x"], ["xf"]),
             h.make_node("CastLike", ["x", "td"], ["xd"]), h.make_node("CastLike", ["xd", "x"], ["y2"]),
             h.make_node("Add", ["xf", "y2"], ["y"])]
    m = kit.make_model(nodes, [("x", T.FLOAT, [7])], [("y", T.FLOAT, [7])],
                       [_init("ti", np.array([3], np.int32)), _init("td", np.array([2.0], np.float64))], opset=opset)
    out, rep = folded(m)
    assert "CastLike" not in kit.ops(out)
    assert kit.ops(out).count("Cast") == 2  # float -> int32 -> float stays (undefined / lossy); the double trip goes


def test_target_of_unknown_type_keeps_the_cast_like(kit, folded) -> None:
    """In a function body the target is a polymorphic function input: its type is unknown, the node stays."""
    fn = h.make_function("local", "F", ["a", "b"], ["c"], [h.make_node("CastLike", ["a", "b"], ["c"])],
                         [h.make_opsetid("", 21)])
    nodes = [h.make_node("F", ["x", "t"], ["y"], domain="local")]
    m = kit.make_model(nodes, [("x", T.FLOAT, [3])], [("y", T.DOUBLE, [3])],
                       [_init("t", np.array([1.0], np.float64))], functions=[fn])
    out, rep = folded(m)
    assert [n.op_type for n in out.functions[0].node] == ["CastLike"]
    assert "cast_like_to_cast" not in rep["rules"]
