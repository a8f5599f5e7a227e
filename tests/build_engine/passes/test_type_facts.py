"""Schema type facts (``passes/type_facts.py``) equal onnx shape inference's element types, and fold asks inference
only where those facts leave a value untyped that inference could type.

- every flat ONNX backend node test model (regenerated from the installed onnx): each value typed by both the view's
  facts and onnx's shape inference has the same type in both, and where the view says it needs no inference,
  inference types nothing the facts do not;
- a model whose Cast input comes from an attribute-typed op (ConstantOfShape, RandomUniformLike's dtype) still folds
  the same-type Cast: the view asks inference then;
- a flat model of schema-typed ops folds without any call to shape inference, and the folded result is exact.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from trtforge.build_engine.core.graph import nested_indices
from trtforge.build_engine.core.shape_inference import infer_shapes
from trtforge.build_engine.passes import fold
from trtforge.build_engine.passes import pipeline as pipeline_mod
from trtforge.build_engine.passes.ir import GraphCtx, Scope
from trtforge.build_engine.passes.type_facts import needs_inference, output_types
from trtforge.build_engine.passes.walk import default_opset, graph_types


def _node_test_models() -> list[onnx.ModelProto]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return [c.model for c in cases if c.model is not None and not c.model.functions
            and not nested_indices(c.model.graph)]


def _view(model: onnx.ModelProto) -> tuple[GraphCtx, dict[str, int]]:
    g = model.graph
    declared = graph_types(g)
    ctx = GraphCtx(g, list(g.node), [i.name for i in g.input], [o.name for o in g.output],
                   Scope(default_opset(model.opset_import), dict(declared)), initializers=list(g.initializer))
    return ctx, declared


def test_facts_agree_with_shape_inference_on_every_node_test() -> None:
    agree = checked = 0
    for model in _node_test_models():
        try:
            inferred = graph_types(infer_shapes(model).graph)
        except Exception:
            continue  # a model inference rejects: its facts are not compared
        ctx, declared = _view(model)
        ours = {k: v for k, v in ctx.types.items() if k not in declared}
        for name, t in ours.items():
            if name in inferred:
                assert inferred[name] == t, (model.graph.name, name, t, inferred[name])
                agree += 1
        if not needs_inference(ctx):
            missing = [k for k in inferred if k not in declared and k not in ours]
            assert not missing, (model.graph.name, missing)
        checked += 1
    assert checked > 1000 and agree > 1000, (checked, agree)


def _types(op: str, opset: int, input_types: list[int], n_outputs: int) -> list[int]:
    names = [f"i{k}" if t else "" for k, t in enumerate(input_types)]
    known = {f"i{k}": t for k, t in enumerate(input_types)}
    return output_types(op, "", opset, names, lambda name: known.get(name, 0), n_outputs)


def test_output_types_read_the_schema() -> None:
    F, I64, B = T.FLOAT, T.INT64, T.BOOL  # noqa: N806
    assert _types("Add", 21, [0, F], 1) == [F]  # any input bound to T
    assert _types("Equal", 21, [F, F], 1) == [B]  # T1 allows bool only
    assert _types("Shape", 21, [0], 1) == [I64]
    assert _types("Concat", 21, [0, T.INT8, 0], 1) == [T.INT8]  # variadic homogeneous input
    assert _types("Split", 18, [T.FLOAT16, I64], 3) == [T.FLOAT16] * 3  # variadic output
    assert _types("TopK", 21, [F, I64], 2) == [F, I64]
    assert _types("ConstantOfShape", 21, [I64], 1) == [0]  # typed by its attribute only
    assert _types("Loop", 21, [I64, B, F], 2) == [0, 0]  # heterogeneous: follows its body
    assert _types("NoSuchOp", 21, [F], 1) == [0]


@pytest.mark.parametrize("producer", ["ConstantOfShape", "RandomUniformLike"])
def test_attribute_typed_input_still_folds(kit, producer: str) -> None:
    if producer == "ConstantOfShape":
        src = h.make_node("ConstantOfShape", ["shape"], ["c"], value=h.make_tensor("v", T.INT32, [1], [7]))
    else:
        src = h.make_node("RandomUniformLike", ["x"], ["c"], dtype=T.INT32)
    nodes = [h.make_node("Shape", ["x"], ["shape"]), src,
             h.make_node("Cast", ["c"], ["c32"], to=T.INT32),  # a no-op: only inference knows c is int32
             h.make_node("Mul", ["c32", "c32"], ["y"])]
    m = kit.make_model(nodes, [("x", T.FLOAT, [2, 3])], [("y", T.INT32, [2, 3])])
    out = fold(m).model
    assert "Cast" not in kit.ops(out)
    if producer == "ConstantOfShape":
        kit.assert_same_outputs(m, out)


def test_schema_typed_graph_folds_without_shape_inference(kit, monkeypatch: pytest.MonkeyPatch,
                                                          rng: np.random.Generator) -> None:
    calls: list[int] = []
    real = pipeline_mod.infer_shapes

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(pipeline_mod, "infer_shapes", counting)
    nodes, cur = [], "x"
    for k in range(int(rng.integers(20, 40))):
        op = ["Relu", "Neg", "Sigmoid", "Where", "Max"][k % 5]
        ins = {"Where": ["cond", cur, "x"], "Max": [cur, "x", cur]}.get(op, [cur])
        nodes += [h.make_node(op, ins, [f"a{k}"]), h.make_node("Cast", [f"a{k}"], [f"b{k}"], to=T.FLOAT)]
        cur = f"b{k}"
    nodes.append(h.make_node("Identity", [cur], ["y"]))
    m = kit.make_model(nodes, [("x", T.FLOAT, [2, 3]), ("cond", T.BOOL, [2, 3])], [("y", T.FLOAT, [2, 3])])
    res = fold(m)
    assert not calls  # every value typed by the schema facts: no inference of the input model
    assert "Cast" not in kit.ops(res.model)
    kit.assert_same_outputs(m, res.model)
