"""The graph utilities every layer shares (``build_engine/core/graph.py``): one stable topological sort, one
shape-inference wrapper (on the weight-free skeleton), one dtype-name table, the subgraph walk."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.core import graph as cg
from trtforge.build_engine.core.errors import ModelError
from trtforge.build_engine.core.onnx_io import check_graph_structure
from trtforge.build_engine.core.shape_inference import infer_shapes


def test_topo_order_is_stable() -> None:
    # A valid order comes back unchanged; independent nodes keep their relative order.
    assert cg.stable_topo_order([set(), set(), {0}, {1}, {2, 3}]) == [0, 1, 2, 3, 4]
    # Node 0 reads node 2: only 2 moves ahead; 1 and 3 (independent) keep their places relative to each other.
    assert cg.stable_topo_order([{2}, set(), set(), set()]) == [1, 2, 0, 3]
    # A cycle leaves its nodes out (callers compare lengths).
    assert cg.stable_topo_order([{1}, {0}, set()]) == [2]


def test_check_graph_structure_sorts_out_of_order_nodes_stably_and_refuses_cycles() -> None:
    nodes = [h.make_node("Neg", ["b"], ["c"], name="n0"), h.make_node("Abs", ["x"], ["a"], name="n1"),
             h.make_node("Neg", ["x"], ["b"], name="n2"), h.make_node("Abs", ["a"], ["d"], name="n3")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info(n, T.FLOAT, [2]) for n in ("c", "d")])
    check_graph_structure(g, "m.onnx")
    assert [n.name for n in g.node] == ["n1", "n2", "n0", "n3"]
    cyc = h.make_graph([h.make_node("Neg", ["b"], ["a"], name="p"), h.make_node("Neg", ["a"], ["b"], name="q")],
                       "g", [], [h.make_tensor_value_info("a", T.FLOAT, [2])])
    with pytest.raises(ModelError, match="cycle through node 'p'"):
        check_graph_structure(cyc, "m.onnx")


def test_check_graph_structure_looks_into_subgraphs_and_outer_names() -> None:
    def with_branch(reads: str) -> onnx.GraphProto:
        branch = h.make_graph([h.make_node("Neg", [reads], ["o"])], "b", [],
                              [h.make_tensor_value_info("o", T.FLOAT, [2])])
        nodes = [h.make_node("Abs", ["x"], ["a"]), h.make_node("If", ["c"], ["y"], then_branch=branch,
                                                               else_branch=branch)]
        return h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2]),
                                         h.make_tensor_value_info("c", T.BOOL, [])],
                            [h.make_tensor_value_info("y", T.FLOAT, [2])])

    check_graph_structure(with_branch("a"), "m.onnx")  # an outer node's output, read inside the branch
    with pytest.raises(ModelError, match="reads 'nowhere'"):
        check_graph_structure(with_branch("nowhere"), "m.onnx")


def test_dtype_names_one_table() -> None:
    assert cg.dtype_name(T.FLOAT) == "float32" and cg.dtype_name(T.BFLOAT16) == "bfloat16"
    assert cg.dtype_name(T.INT32) == "int32" and cg.dtype_name(T.BOOL) == "bool"
    assert cg.dtype_name(None) == "elem_type None" and cg.dtype_name(0) == "elem_type 0"
    for elem, name in cg.DTYPE_NAMES.items():
        assert cg.elem_type(name) == elem


def test_infer_shapes_runs_on_the_skeleton_and_types_big_weights() -> None:
    w = nh.from_array(np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32), "w")  # >= 1024 elems
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("Relu", ["y"], ["z"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["n", 64])],
                     [h.make_tensor_value_info("z", T.FLOAT, None)],
                     initializer=[w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    inferred = infer_shapes(m, strict=True)
    assert not inferred.graph.initializer  # the weight never went through onnx's serialisation
    assert {i.name for i in inferred.graph.input} == {"x", "w"}
    y = next(v for v in inferred.graph.value_info if v.name == "y")
    assert cg.tensor_dims(y) == ("n", 32)
    seen = []
    infer_shapes(m, edit=lambda graph: seen.append(len(graph.node)))
    assert seen == [2] and len(m.graph.initializer) == 1  # the input model is untouched


def test_all_graphs_and_free_names_walk_nested_bodies() -> None:
    inner = h.make_graph([h.make_node("Add", ["x", "outer"], ["t"])], "inner", [],
                         [h.make_tensor_value_info("t", T.FLOAT, [1])])
    node = h.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=inner)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1])])
    assert [x.name for x in cg.all_graphs(g)] == ["g", "inner", "inner"]
    assert cg.free_names(inner) == {"x", "outer"}
    assert [n.op_type for n in cg.model_nodes(onnx.helper.make_model(g))] == ["If", "Add", "Add"]
