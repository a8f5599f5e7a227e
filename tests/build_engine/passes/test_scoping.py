"""Value names are scoped per graph: types resolve by lexical scope (captures, shadowing, sibling bodies, functions).

Each model is built in code and, where ONNX allows it, passes ``onnx.checker.check_model(full_check=True)``; every
fold is checked bit-exact under ``onnx.reference`` with inputs that a wrong fold would change (values that fp16
rounds, both If conditions, loops that run their body).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from trtforge.build_engine.passes import fold
from trtforge.build_engine.verify.compare import compare_arrays

F, F16, F64, B, I64 = T.FLOAT, T.FLOAT16, T.DOUBLE, T.BOOL, T.INT64
X = np.array([1.0001, -2.5e-5, 70000.0, 3.14159], np.float32)  # every value changes under fp16 rounding


def cast(i: str, o: str, to: int) -> onnx.NodeProto:
    return h.make_node("Cast", [i], [o], to=to)


def vi(name: str, t: int, shape: Sequence[int] | None = (4,)) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, t, None if shape is None else list(shape))


def model(nodes, inputs, outputs, *, functions=(), check: bool = True) -> onnx.ModelProto:
    opsets = [h.make_opsetid("", 21)] + ([h.make_opsetid("local", 1)] if functions else [])
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs), opset_imports=opsets, functions=list(functions))
    m.ir_version = 10
    if check:
        onnx.checker.check_model(m, full_check=True)
    return m


def exact(m: onnx.ModelProto, feeds_list: Sequence[dict]) -> onnx.ModelProto:
    out = fold(m).model
    for feeds in feeds_list:
        a, b = ReferenceEvaluator(m).run(None, feeds), ReferenceEvaluator(out).run(None, feeds)
        for x, y in zip(a, b, strict=True):
            assert compare_arrays(np.asarray(x), np.asarray(y)).bitwise, (feeds, x, y)
    return out


def both(**extra) -> list[dict]:
    return [{"x": X, "c": np.array(v), **extra} for v in (True, False)]


def branch(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    return next(a.g for a in node.attribute if a.name == name)


def casts(g: onnx.GraphProto) -> list[int]:
    return [n.attribute[0].i for n in g.node if n.op_type == "Cast"]


def test_main_graph_lossy_round_trip_beside_if_branch_local_of_same_name() -> None:
    """The If branch has a local float32 ``t``; the main graph's ``t`` is float16: its round trip must stay."""
    then = h.make_graph([h.make_node("Relu", ["x"], ["t"]), h.make_node("Neg", ["t"], ["to"])], "then", [],
                        [vi("to", F)])
    other = h.make_graph([h.make_node("Abs", ["x"], ["t"]), h.make_node("Neg", ["t"], ["eo"])], "else", [],
                         [vi("eo", F)])
    nodes = [h.make_node("If", ["c"], ["z"], then_branch=then, else_branch=other),
             cast("x", "t", F16), cast("t", "y", F)]
    out = exact(model(nodes, [vi("x", F), vi("c", B, [])], [vi("y", F), vi("z", F)]), both())
    assert casts(out.graph) == [F16, F]


@pytest.mark.parametrize("body_first", [True, False])
def test_loop_body_reusing_a_main_graph_name_with_another_type(body_first: bool) -> None:
    """Body ``h`` is float16 (a lossy round trip through it), main-graph ``h`` is float32 (a same-type Cast that
    goes), or the other way round: neither type leaks into the other scope."""
    lossy = [cast("acc", "h", F16), cast("h", "acc_out", F)]
    same = [h.make_node("Relu", ["acc"], ["h"]), cast("h", "acc_out", F)]
    body = h.make_graph((lossy if body_first else same) + [h.make_node("Identity", ["c_in"], ["c_out"])], "body",
                        [vi("i", I64, []), vi("c_in", B, []), vi("acc", F)], [vi("c_out", B, []), vi("acc_out", F)])
    main = [h.make_node("Relu", ["x"], ["h"]), cast("h", "y", F)] if body_first else [cast("x", "h", F16),
                                                                                        cast("h", "y", F)]
    nodes = [h.make_node("Loop", ["n", "c", "x"], ["z"], body=body), *main]
    m = model(nodes, [vi("x", F), vi("n", I64, []), vi("c", B, [])], [vi("y", F), vi("z", F)])
    out = exact(m, [{"x": X, "n": np.array(k, np.int64), "c": np.array(True)} for k in (1, 3)])
    body_out = out.graph.node[0].attribute[0].g
    if body_first:
        assert casts(body_out) == [F16, F] and casts(out.graph) == []
    else:
        assert casts(body_out) == [] and casts(out.graph) == [F16, F]


def test_if_branches_reusing_a_name_with_different_types() -> None:
    """then: ``t`` float16 (lossy round trip); else: ``t`` float32 (same-type Cast): each branch on its own."""
    then = h.make_graph([cast("x", "t", F16), cast("t", "o", F), h.make_node("Neg", ["o"], ["to"])], "then", [],
                        [vi("to", F)])
    other = h.make_graph([h.make_node("Relu", ["x"], ["t"]), cast("t", "o", F), h.make_node("Neg", ["o"], ["eo"])],
                         "else", [], [vi("eo", F)])
    m = model([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], [vi("x", F), vi("c", B, [])],
              [vi("y", F)])
    out = exact(m, both())
    then_out, else_out = branch(out.graph.node[0], "then_branch"), branch(out.graph.node[0], "else_branch")
    assert casts(then_out) == [F16, F] and casts(else_out) == []


def _depth3(shadow: bool) -> onnx.ModelProto:
    """main: a = Cast(x, f64); If -> Loop -> If: innermost reads ``a`` and casts back to float32. With ``shadow``,
    the Loop body's carried input is named ``x`` too (an inner ``x`` that is not the main graph's)."""
    carried = "x" if shadow else "acc"
    inner_then = h.make_graph([cast("a", "b", F), h.make_node("Add", ["b", carried], ["r"])], "inner_then", [],
                              [vi("r", F)])
    inner_else = h.make_graph([h.make_node("Neg", [carried], ["r2"])], "inner_else", [], [vi("r2", F)])
    body = h.make_graph([h.make_node("If", ["c_in"], ["acc_out"], then_branch=inner_then, else_branch=inner_else),
                         h.make_node("Identity", ["c_in"], ["c_out"])], "body",
                        [vi("i", I64, []), vi("c_in", B, []), vi(carried, F)], [vi("c_out", B, []), vi("acc_out", F)])
    then = h.make_graph([h.make_node("Loop", ["n", "c", "x"], ["lo"], body=body)], "then", [], [vi("lo", F)])
    other = h.make_graph([h.make_node("Neg", ["x"], ["eo"])], "else", [], [vi("eo", F)])
    nodes = [cast("x", "a", F64), h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    return model(nodes, [vi("x", F), vi("n", I64, []), vi("c", B, [])], [vi("y", F)], check=not shadow)


def _innermost(m: onnx.ModelProto) -> onnx.GraphProto:
    if_node = next(n for n in m.graph.node if n.op_type == "If")
    loop = branch(if_node, "then_branch").node[0]
    return branch(branch(loop, "body").node[0], "then_branch")


@pytest.mark.parametrize("shadow", [False, True], ids=["capture", "shadowed"])
def test_capture_three_levels_deep_and_shadowing(shadow: bool) -> None:
    m = _depth3(shadow)
    feeds = [{"x": X, "n": np.array(k, np.int64), "c": np.array(c)} for k in (1, 2) for c in (True, False)]
    out = exact(m, feeds)
    inner = _innermost(out)
    if shadow:  # ``x`` inside means the carried value: reading it instead of ``a`` would change the result
        assert casts(inner) == [F]
    else:  # the round trip x -> f64 -> f32 across three scopes is exact: the innermost Add reads x itself
        assert casts(inner) == [] and inner.node[0].input[0] == "x"


def test_functions_reusing_names_with_other_types() -> None:
    """Two model-local functions use ``t`` for a float16 and a float64 value; the main graph has a float32 ``t``."""
    f1 = h.make_function("local", "Lossy", ["fx"], ["fy"], [cast("fx", "t", F16), cast("t", "fy", F)],
                         [h.make_opsetid("", 21)])
    body = [cast("fx", "u", F), cast("u", "t", F64), cast("t", "v", F), h.make_node("Neg", ["v"], ["fy"])]
    f2 = h.make_function("local", "Exact", ["fx"], ["fy"], body, [h.make_opsetid("", 21)])
    nodes = [h.make_node("Relu", ["x"], ["t"]), cast("t", "t2", F),
             h.make_node("Lossy", ["t2"], ["y1"], domain="local"), h.make_node("Exact", ["t2"], ["y2"], domain="local")]
    m = model(nodes, [vi("x", F)], [vi("y1", F), vi("y2", F)], functions=[f1, f2])
    out = exact(m, [{"x": X}])
    lossy, ex = out.functions
    assert casts(lossy) == [F16, F]  # kept: fp32 -> fp16 -> fp32 rounds
    assert casts(ex) == [F]  # u (float32, fixed by the function) -> f64 -> f32: exact round trip
    assert casts(out.graph) == []  # the main graph's same-type Cast of float32 t
