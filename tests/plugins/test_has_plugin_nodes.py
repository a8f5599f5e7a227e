"""``has_plugin_nodes`` looks into If/Loop/Scan bodies, not only the main graph."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from trtforge.plugins import has_plugin_nodes
from trtforge.plugins.lora import spec


def _if_model(branch_op: str, domain: str) -> onnx.ModelProto:
    def branch(name: str, op: str, dom: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_y"], domain=dom)], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [2])])

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("then", "Identity", ""),
                            else_branch=branch("else", branch_op, domain))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(spec.ONNX_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def test_plugin_node_inside_an_if_branch_is_found() -> None:
    assert has_plugin_nodes(_if_model(spec.PLUGIN_NAME, spec.ONNX_DOMAIN))
    assert not has_plugin_nodes(_if_model("Neg", ""))
    assert not has_plugin_nodes(_if_model(spec.PLUGIN_NAME, "com.other"))  # another vendor's op of that name


def test_one_predicate_for_every_plugin_node_in_subgraphs_and_functions() -> None:
    """``is_plugin_node`` is the registry's predicate; ``has_plugin_nodes`` applies it to every node of the model,
    model-local function bodies included."""
    from trtforge.build_engine.core.graph import model_nodes
    from trtforge.plugins import PLUGIN_OPS, is_plugin_node

    assert spec.PLUGIN_NAME in PLUGIN_OPS
    m = _if_model(spec.PLUGIN_NAME, spec.ONNX_DOMAIN)
    assert [n.op_type for n in model_nodes(m) if is_plugin_node(n)] == [spec.PLUGIN_NAME]
    assert is_plugin_node(helper.make_node(spec.PLUGIN_NAME, ["x"], ["y"]))  # exporter dropped the domain
    fn = helper.make_function("local", "Wrap", ["a"], ["b"],
                              [helper.make_node(spec.PLUGIN_NAME, ["a"], ["b"], domain=spec.ONNX_DOMAIN)],
                              [helper.make_opsetid("", 17), helper.make_opsetid(spec.ONNX_DOMAIN, 1)])
    g = helper.make_graph([helper.make_node("Wrap", ["x"], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    assert has_plugin_nodes(helper.make_model(g, functions=[fn]))
