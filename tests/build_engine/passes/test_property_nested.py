"""The property test again, with the random graph placed inside If branches and inside a model-local function.

Exercises what a flat graph cannot: reads of outer-scope values from a subgraph (renamed when an outer Identity
goes), outer Casts seen from a branch, branch outputs that must keep their names, and polymorphic function bodies
where only Cast/Constant types are known.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h

_spec = importlib.util.spec_from_file_location("_fold_prop", Path(__file__).with_name("test_property.py"))
assert _spec is not None and _spec.loader is not None
_prop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_prop)

_EXAMPLES = int(os.environ.get("FOLD_PROP_EXAMPLES", "300")) // 3


def _renamed(graph: onnx.GraphProto, prefix: str, keep: set[str]) -> list[onnx.NodeProto]:
    def r(name: str) -> str:
        return name if (not name or name in keep) else prefix + name

    out = []
    for n in graph.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        del m.input[:]
        m.input.extend(r(i) for i in n.input)
        del m.output[:]
        m.output.extend(r(o) for o in n.output)
        out.append(m)
    return out


def wrap_in_if(model: onnx.ModelProto, same_names: bool = False) -> onnx.ModelProto:
    """The graph as both branches of an If; with ``same_names`` both branches use the same local names (and types),
    which ONNX allows for sibling scopes."""
    g = model.graph
    keep = {i.name for i in g.input} | {t.name for t in g.initializer}
    branches = []
    for prefix in (("b_", "b_") if same_names else ("t_", "e_")):
        outs = [h.make_tensor_value_info(prefix + o.name, o.type.tensor_type.elem_type,
                                         [d.dim_value for d in o.type.tensor_type.shape.dim]) for o in g.output]
        branches.append(h.make_graph(_renamed(g, prefix, keep), prefix + "branch", [], outs))
    if same_names:
        branches[1].name = "else_branch"
    node = h.make_node("If", ["flag"], [o.name for o in g.output], then_branch=branches[0], else_branch=branches[1])
    graph = h.make_graph([node], "wrapped", [*g.input, h.make_tensor_value_info("flag", T.BOOL, [])], list(g.output),
                         initializer=list(g.initializer))
    m = h.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return m


def wrap_in_function(model: onnx.ModelProto) -> onnx.ModelProto:
    g = model.graph
    consts = [h.make_node("Constant", [], [t.name], value=t) for t in g.initializer]
    fn = h.make_function("local", "Body", [i.name for i in g.input], [o.name for o in g.output],
                         consts + list(g.node), [h.make_opsetid("", 21)])
    call = h.make_node("Body", [i.name for i in g.input], [o.name for o in g.output], domain="local")
    graph = h.make_graph([call], "caller", list(g.input), list(g.output))
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("local", 1)], functions=[fn])
    m.ir_version = model.ir_version
    return m


def _check(kit, model: onnx.ModelProto, seed: int) -> None:
    from trtforge.build_engine.passes import fold

    onnx.checker.check_model(model)
    res = fold(model)
    onnx.checker.check_model(res.model)
    onnx.shape_inference.infer_shapes(res.model, check_type=True, strict_mode=True)
    kit.assert_same_outputs(model, res.model, seeds=(seed,))
    again = fold(res.model)
    assert again.report.rules == {}, again.report
    assert [o.name for o in res.model.graph.output] == [o.name for o in model.graph.output]


_SETTINGS = settings(max_examples=_EXAMPLES, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(_prop.graphs(), st.integers(0, 2**31 - 1))
def test_fold_inside_if_branches(kit, model: onnx.ModelProto, seed: int) -> None:
    _check(kit, wrap_in_if(model), seed)


@_SETTINGS
@given(_prop.graphs(), st.integers(0, 2**31 - 1))
def test_fold_inside_if_branches_that_reuse_names(kit, model: onnx.ModelProto, seed: int) -> None:
    """Both branches define the same names with the same types, and the main graph keeps its own values: each
    branch's view resolves only its own locals (a shared name table would mix the two branches' producers)."""
    _check(kit, wrap_in_if(model, same_names=True), seed)


@_SETTINGS
@given(_prop.graphs(), st.integers(0, 2**31 - 1))
def test_fold_inside_model_local_function(kit, model: onnx.ModelProto, seed: int) -> None:
    _check(kit, wrap_in_function(model), seed)
