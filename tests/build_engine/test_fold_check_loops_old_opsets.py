"""fold --check caps Loops at every opset: below opset 9 (no int64 Min/Less, no Where) a Loop bounded only by its
condition, or by a trip count a value class makes 2**62, never ended (the check hung). Now the cap is a Constant
trip count, or min(M, cap) as a float Min between two Casts, exact for every count up to the cap."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.verify.bitwise import MAX_LOOP_TRIPS, check_equivalent, run_model
from trtforge.build_engine.verify.loops import runnable_loops
from trtforge_testing import graph_model


def _doubling_body() -> onnx.GraphProto:
    # while v < 1e30: v = 2 |v| (never ends for +-0.0)
    return h.make_graph([h.make_node("Abs", ["v"], ["a"]), h.make_node("Mul", ["a", "two"], ["v2"]),
                         h.make_node("Less", ["v2", "lim"], ["c2"])],
                        "body", [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, [1]),
                                 h.make_tensor_value_info("v", T.FLOAT, [1])],
                        [h.make_tensor_value_info("c2", T.BOOL, [1]), h.make_tensor_value_info("v2", T.FLOAT, [1])],
                        initializer=[nh.from_array(np.array([2.0], np.float32), "two")])


@pytest.mark.parametrize("opset", [8])  # each run is 10,000 trips in onnx.reference (~10 s)
def test_a_loop_bounded_by_its_condition_alone_ends_below_opset_9(opset: int) -> None:
    lim = nh.from_array(np.array([1e30], np.float32), "lim")

    def model(tail: str) -> onnx.ModelProto:
        nodes = [h.make_node("Less", ["x", "lim"], ["c0"]), h.make_node("Loop", ["", "c0", "x"], ["v"],
                                                                        body=_doubling_body()),
                 h.make_node(tail, ["v"], ["y"])]
        return graph_model(nodes, [("x", T.FLOAT, [1])], [("y", T.FLOAT, [1])], inits=[lim], opsets=(("", opset),))

    same, changed = model("Identity"), model("Neg")
    onnx.checker.check_model(same, full_check=True)
    result = check_equivalent(same, changed)
    assert not result.passed and result.runs > 2


def _counting(opset: int) -> onnx.ModelProto:
    # v = x; repeat n times: v = v + 1 -- a value-class n of 2**62 never ended below opset 9
    body = h.make_graph([h.make_node("Add", ["v", "one"], ["v2"]), h.make_node("Identity", ["c"], ["c2"])], "body",
                        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
                         h.make_tensor_value_info("v", T.FLOAT, [1])],
                        [h.make_tensor_value_info("c2", T.BOOL, []), h.make_tensor_value_info("v2", T.FLOAT, [1])],
                        initializer=[nh.from_array(np.array([1.0], np.float32), "one")])
    nodes = [h.make_node("Loop", ["n", "", "x"], ["y"], body=body)]
    return graph_model(nodes, [("n", T.INT64, []), ("x", T.FLOAT, [1])], [("y", T.FLOAT, [1])],
                       opsets=(("", opset),))


@pytest.mark.parametrize("opset", [1, 8])
def test_a_trip_count_is_capped_below_opset_9(opset: int) -> None:
    m = _counting(opset)
    onnx.checker.check_model(m, full_check=True)
    x = np.array([0.5], np.float32)
    for n, want in ((0, 0.5), (3, 3.5), (MAX_LOOP_TRIPS - 1, MAX_LOOP_TRIPS - 0.5), (2**62, MAX_LOOP_TRIPS + 0.5)):
        got = run_model(m, {"n": np.array(n, np.int64), "x": x}, "onnx.reference")[0]
        assert got.tolist() == [want], (n, got)
    assert check_equivalent(m, m).passed


def test_two_unnamed_loops_get_their_own_cap_names() -> None:
    # two Loops with no node name and an empty first output (an unused final value) got the same added names
    # ("__trtforge_check_cap" twice), so the checked copy was not a valid graph
    def loop(x: str, scan: str) -> onnx.NodeProto:
        body = h.make_graph([h.make_node("Add", ["v", "one"], ["v2"]), h.make_node("Identity", ["c"], ["c2"]),
                             h.make_node("Identity", ["v2"], ["s"])], "body",
                            [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
                             h.make_tensor_value_info("v", T.FLOAT, [1])],
                            [h.make_tensor_value_info("c2", T.BOOL, []), h.make_tensor_value_info("v2", T.FLOAT, [1]),
                             h.make_tensor_value_info("s", T.FLOAT, [1])],
                            initializer=[nh.from_array(np.array([1.0], np.float32), "one")])
        return h.make_node("Loop", ["n", "", x], ["", scan], body=body)

    m = graph_model([loop("x", "s1"), loop("x", "s2")], [("n", T.INT64, []), ("x", T.FLOAT, [1])],
                    [("s1", T.FLOAT, [None, 1]), ("s2", T.FLOAT, [None, 1])], opsets=(("", 17),))
    onnx.checker.check_model(m, full_check=True)
    onnx.checker.check_model(runnable_loops(m), full_check=True)  # SSA: the added names are unique
    got = run_model(m, {"n": np.array(3, np.int64), "x": np.array([0.5], np.float32)}, "onnx.reference")
    assert [g.ravel().tolist() for g in got] == [[1.5, 2.5, 3.5]] * 2
    assert check_equivalent(m, m).passed
    # (onnxruntime 1.2x crashes on a Loop with an empty first output; the check runs onnx.reference first)
