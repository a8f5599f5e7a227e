"""Read-only helpers over ONNX protos for the pass view (``ir``): names a graph defines, a Constant node's value."""

from __future__ import annotations

import onnx
from onnx import AttributeProto, GraphProto, NodeProto, TensorProto

from ..core.graph import all_graphs


def defined_names(graph: GraphProto) -> set[str]:
    """Every name a graph or any graph nested in it defines (inputs, initializers, node outputs)."""
    out: set[str] = set()
    for g in all_graphs(graph):
        out.update(i.name for i in g.input)
        out.update(t.name for t in g.initializer)
        out.update(t.values.name for t in g.sparse_initializer)
        for n in g.node:
            out.update(n.output)
    out.discard("")
    return out


def constant_node_tensor(p: NodeProto) -> TensorProto | None:
    """A Constant node's value as a TensorProto (value / value_float(s) / value_int(s)); None for others."""
    for a in p.attribute:
        if a.ref_attr_name:
            return None
        if a.name == "value" and a.type == AttributeProto.TENSOR:
            return a.t
        if a.name == "value_float":
            return onnx.helper.make_tensor("", TensorProto.FLOAT, [], [a.f])
        if a.name == "value_floats":
            return onnx.helper.make_tensor("", TensorProto.FLOAT, [len(a.floats)], list(a.floats))
        if a.name == "value_int":
            return onnx.helper.make_tensor("", TensorProto.INT64, [], [a.i])
        if a.name == "value_ints":
            return onnx.helper.make_tensor("", TensorProto.INT64, [len(a.ints)], list(a.ints))
    return None
