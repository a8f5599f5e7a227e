"""The pipeline walks If/Loop bodies and model-local functions, and keeps names that enclosing scopes read."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h

F, F64, B, I64 = T.FLOAT, T.DOUBLE, T.BOOL, T.INT64


def cast(i: str, o: str, to: int):
    return h.make_node("Cast", [i], [o], to=to)


def _branch(name: str, op: str) -> onnx.GraphProto:
    # reads outer values `a` (a Cast of x to float64) and `x`; round trip a -> float back to x's type
    nodes = [cast("a", f"{name}_b", F), h.make_node("Identity", [f"{name}_b"], [f"{name}_c"]),
             h.make_node(op, [f"{name}_c"], [f"{name}_out"])]
    return h.make_graph(nodes, name, [], [h.make_tensor_value_info(f"{name}_out", F, [4])])


def test_if_branches_are_folded_and_outer_values_kept(kit, folded) -> None:
    nodes = [cast("x", "a", F64), h.make_node("Cast", ["flag"], ["cond"], to=B),
             h.make_node("If", ["cond"], ["y"], then_branch=_branch("then", "Neg"), else_branch=_branch("else", "Abs"))]
    m = kit.make_model(nodes, [("x", F, [4]), ("flag", T.INT32, [])], [("y", F, [4])])
    out, rep = folded(m)
    if_node = next(n for n in out.graph.node if n.op_type == "If")
    for attr in if_node.attribute:
        assert [n.op_type for n in attr.g.node] in (["Neg"], ["Abs"])
        assert attr.g.node[0].input[0] == "x"
    assert rep["rules"]["cast_round_trip"] == 2 and rep["rules"]["identity"] == 2
    # the outer Cast to float64 is no longer read by anyone: dead
    assert "Cast" in [n.op_type for n in out.graph.node]  # the flag cast stays (int32 -> bool is lossy)
    assert sum(n.op_type == "Cast" for n in out.graph.node) == 1


def test_outer_identity_read_by_subgraph_is_renamed_inside(kit, folded) -> None:
    body = h.make_graph([h.make_node("Add", ["ix", "ix"], ["o"])], "then", [],
                        [h.make_tensor_value_info("o", F, [4])])
    other = h.make_graph([h.make_node("Neg", ["ix"], ["o2"])], "else", [],
                         [h.make_tensor_value_info("o2", F, [4])])
    nodes = [h.make_node("Identity", ["x"], ["ix"]), h.make_node("Cast", ["flag"], ["cond"], to=B),
             h.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=other)]
    m = kit.make_model(nodes, [("x", F, [4]), ("flag", T.INT32, [])], [("y", F, [4])])
    out, rep = folded(m)
    assert "Identity" not in [n.op_type for n in out.graph.node] and rep["rules"]["identity"] == 1
    if_node = next(n for n in out.graph.node if n.op_type == "If")
    assert all(i == "x" for a in if_node.attribute for n in a.g.node for i in n.input)


def test_loop_body_is_folded(kit, folded) -> None:
    body = h.make_graph(
        [cast("acc", "acc64", F64), cast("acc64", "acc32", F), h.make_node("Add", ["acc32", "x"], ["acc_out"]),
         h.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [h.make_tensor_value_info("i", I64, []), h.make_tensor_value_info("c_in", B, []),
                 h.make_tensor_value_info("acc", F, [4])],
        [h.make_tensor_value_info("c_out", B, []), h.make_tensor_value_info("acc_out", F, [4])])
    trip = onnx.numpy_helper.from_array(np.array(3, np.int64), "trip")
    cond = onnx.numpy_helper.from_array(np.array(True), "cond0")
    m = kit.make_model([h.make_node("Loop", ["trip", "cond0", "x"], ["y"], body=body)], [("x", F, [4])],
                       [("y", F, [4])], [trip, cond])
    out, rep = folded(m)
    loop_body = out.graph.node[0].attribute[0].g
    assert [n.op_type for n in loop_body.node] == ["Add", "Identity"]  # c_in -> c_out: input to output, kept
    assert rep["rules"]["cast_round_trip"] == 1


def test_model_local_function_is_folded(kit, folded) -> None:
    fn = h.make_function(
        "local", "Roundtrip", ["fx"], ["fy"],
        [cast("fx", "f32", F), cast("f32", "f64", F64), cast("f64", "back", F),
         h.make_node("Identity", ["back"], ["mid"]), h.make_node("Neg", ["mid"], ["fy"])],
        [h.make_opsetid("", 21)])
    m = kit.make_model([h.make_node("Roundtrip", ["x"], ["y"], domain="local")], [("x", F, [4])],
                       [("y", F, [4])], functions=[fn])
    out, rep = folded(m)
    assert [n.op_type for n in out.functions[0].node] == ["Cast", "Neg"]
    assert list(out.functions[0].output) == ["fy"]
    assert rep["rules"]["cast_round_trip"] == 1 and rep["rules"]["identity"] == 1


def test_function_value_info_of_moved_and_removed_values_is_dropped(kit, folded) -> None:
    """A function's value_info (IR 10) declared ``r`` float; sink_cast makes the Reshape read the float16 value, so
    that entry was wrong after folding (and ``b``'s dangling): inlining the function then gave a model onnx's
    inference and onnxruntime reject."""
    import onnx.inliner

    body = [cast("fx", "a", T.FLOAT16), cast("a", "b", F),
            h.make_node("Constant", [], ["sh"], value=onnx.numpy_helper.from_array(np.array([-1], np.int64))),
            h.make_node("Reshape", ["b", "sh"], ["r"]), cast("r", "fy", F64)]
    fn = h.make_function("local", "Sink", ["fx"], ["fy"], body, [h.make_opsetid("", 21)])
    fn.value_info.extend([h.make_tensor_value_info(n, t, None) for n, t in (("a", T.FLOAT16), ("b", F), ("r", F))])
    m = kit.make_model([h.make_node("Sink", ["x"], ["y"], domain="local")], [("x", F, [4, 8])], [("y", F64, [32])],
                       functions=[fn])
    onnx.checker.check_model(onnx.inliner.inline_local_functions(m), full_check=True)
    out, rep = folded(m)
    assert rep["rules"]["sink_cast"] == 1 and [n.op_type for n in out.functions[0].node] == [
        "Cast", "Constant", "Reshape", "Cast"]
    assert [v.name for v in out.functions[0].value_info] == ["a"]
    inlined = onnx.inliner.inline_local_functions(out)
    onnx.checker.check_model(inlined, full_check=True)
    kit.assert_same_outputs(m, inlined, seeds=(3, 4))
