"""Held-out fold cases, round 3: what dead-node elimination takes (fold --help: nodes of any ONNX op whose outputs
nothing reads; nodes of other domains are kept)."""

from __future__ import annotations

import numpy as np
import onnx
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
