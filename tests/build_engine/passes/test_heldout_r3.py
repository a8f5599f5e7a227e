"""Held-out fold cases, round 3: what dead-node elimination takes (fold --help: nodes of any ONNX op whose outputs
nothing reads; nodes of other domains are kept), and which constant expressions have one value in every runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.passes import fold


def test_dead_onnx_nodes_go_and_other_domains_stay() -> None:
    nodes = [h.make_node("Abs", ["x"], ["y"]),
             h.make_node("RandomNormal", [], ["noise"], shape=[4]),  # side-effect free: dead, removed
             h.make_node("Binarizer", ["x"], ["b"], domain="ai.onnx.ml"),  # another domain: kept, read or not
             h.make_node("Neg", ["b"], ["nb"]),  # default domain, dead: removed (its input's producer stays)
             h.make_node("Gelu", ["x"], ["g"], domain="com.microsoft")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [4])],
                     initializer=[nh.from_array(np.ones(4, np.float32), "unread")])
    ops = [h.make_opsetid("", 18), h.make_opsetid("ai.onnx.ml", 3), h.make_opsetid("com.microsoft", 1)]
    m = h.make_model(g, opset_imports=ops)
    m.ir_version = 8
    onnx.checker.check_model(m)
    res = fold(m)  # com.microsoft Gelu: onnx.reference cannot run it, so no output comparison here
    assert [n.op_type for n in res.model.graph.node] == ["Abs", "Binarizer", "Gelu"]
    assert not res.model.graph.initializer
    assert res.report.removed == {"Neg": 1, "RandomNormal": 1}


@pytest.mark.parametrize(("a", "b", "folds"), [
    ([1.0, -2.0], [3.0, -1.0], True),  # one answer everywhere
    ([0.0, 1.0], [-0.0, 2.0], False),  # max(+0.0, -0.0): numpy's float32 gives its second argument, float16 its first
    ([np.nan, 1.0], [1.0, 2.0], False),  # NaN: numpy propagates it, fmax-style runtimes drop it
])
@pytest.mark.parametrize("op", ["Max", "Min"])
def test_float_min_max_fold_only_when_every_runtime_agrees(kit, folded, op: str, a: list, b: list,
                                                           folds: bool) -> None:
    nodes = [h.make_node(op, ["ca", "cb"], ["m"]), h.make_node("Cast", ["m"], ["md"], to=T.DOUBLE),
             h.make_node("Cast", ["x"], ["xd"], to=T.DOUBLE), h.make_node("Add", ["xd", "md"], ["y"])]
    inits = [nh.from_array(np.array(a, np.float32), "ca"), nh.from_array(np.array(b, np.float32), "cb")]
    m = kit.make_model(nodes, [("x", T.FLOAT, [2])], [("y", T.DOUBLE, [2])], inits)
    out, rep = folded(m)
    assert (op not in kit.ops(out)) == folds, kit.ops(out)
    assert bool(rep["rules"].get("constant_expression")) == folds
