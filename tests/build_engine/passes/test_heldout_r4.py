"""Held-out fold cases, round 4: model parts outside the inference graph that fold must keep meaning what they
meant (training_info's state)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.passes import fold


def _training_model() -> onnx.ModelProto:
    """``y = x + Cast(k, float)``, plus ``w`` that only training reads; the training step ``k += 1, w = w + w``."""
    g = h.make_graph([h.make_node("Cast", ["k"], ["kf"], to=T.FLOAT), h.make_node("Add", ["x", "kf"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [2])], [h.make_tensor_value_info("y", T.FLOAT, [2])],
                     initializer=[nh.from_array(np.array([1, 2], np.int32), "k"),
                                  nh.from_array(np.ones(2, np.float32), "w")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    ti = onnx.TrainingInfoProto()
    ti.algorithm.CopyFrom(h.make_graph(
        [h.make_node("Add", ["k", "one"], ["k_new"]), h.make_node("Add", ["w", "w"], ["w_new"])], "step", [],
        [h.make_tensor_value_info("k_new", T.INT32, [2]), h.make_tensor_value_info("w_new", T.FLOAT, [2])],
        initializer=[nh.from_array(np.array(1, np.int32), "one")]))
    ti.update_binding.extend([onnx.StringStringEntryProto(key="k", value="k_new"),
                              onnx.StringStringEntryProto(key="w", value="w_new")])
    m.training_info.append(ti)
    onnx.checker.check_model(m, full_check=True)
    return m


def test_training_state_is_neither_folded_nor_dropped() -> None:
    # k and w are variables a training step overwrites: Cast(k) folded into a constant would freeze k's current value
    # (the trained model's y would not move), and dropping k and w (unread by the inference graph) left the
    # update_binding keys naming no initializer
    m = _training_model()
    res = fold(m).model
    assert [n.op_type for n in res.graph.node] == ["Cast", "Add"]
    assert sorted(t.name for t in res.graph.initializer) == ["k", "w"]
    assert res.training_info[0] == m.training_info[0]
    onnx.checker.check_model(res, full_check=True)


def test_dead_if_whose_branch_holds_another_domain_is_kept() -> None:
    # fold --help: nodes of other domains are kept, read or not; removing the unread If took its ai.onnx.ml node
    # (and, for a plugin, whatever effect it has) with it
    then = h.make_graph([h.make_node("Binarizer", ["x"], ["t"], domain="ai.onnx.ml")], "then", [],
                        [h.make_tensor_value_info("t", T.FLOAT, [4])])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [h.make_tensor_value_info("e", T.FLOAT, [4])])
    plain = h.make_graph([h.make_node("Abs", ["x"], ["p"])], "plain", [], [h.make_tensor_value_info("p", T.FLOAT, [4])])
    g = h.make_graph([h.make_node("If", ["c"], ["unread"], then_branch=then, else_branch=other),
                      h.make_node("If", ["c"], ["unread2"], then_branch=plain, else_branch=other),
                      h.make_node("Neg", ["x"], ["y"])], "g",
                     [h.make_tensor_value_info("c", T.BOOL, []), h.make_tensor_value_info("x", T.FLOAT, [4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    res = fold(m)
    assert [n.op_type for n in res.model.graph.node] == ["If", "Neg"]
    assert res.model.graph.node[0].output == ["unread"]
    assert res.report.removed == {"Abs": 1, "If": 1, "Neg": 1}  # the second If (default domain only) still goes


def _stale_input_value_info(body_vi: bool) -> onnx.ModelProto:
    """``y = Neg(Cast(x, int32))`` with a value_info entry that says the float input ``x`` is int32 (onnx's checker
    and inference read a graph input's own type and never check such an entry); ``body_vi``: the same inside a Loop
    body, for its loop-carried input ``v``."""
    cast = [h.make_node("Cast", ["v" if body_vi else "x"], ["a"], to=T.INT32), h.make_node("Neg", ["a"], ["b"])]
    if not body_vi:
        g = h.make_graph([*cast[:1], h.make_node("Neg", ["a"], ["y"])], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [4])], [h.make_tensor_value_info("y", T.INT32, [4])],
                         value_info=[h.make_tensor_value_info("x", T.INT32, [4])])
    else:
        body = h.make_graph([*cast, h.make_node("Identity", ["c"], ["c2"])], "body",
                            [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
                             h.make_tensor_value_info("v", T.FLOAT, [4])],
                            [h.make_tensor_value_info("c2", T.BOOL, []), h.make_tensor_value_info("v", T.FLOAT, [4]),
                             h.make_tensor_value_info("b", T.INT32, [4])],
                            value_info=[h.make_tensor_value_info("v", T.INT32, [4])])
        g = h.make_graph([h.make_node("Constant", [], ["n"], value=nh.from_array(np.array(2, np.int64))),
                          h.make_node("Constant", [], ["t"], value=nh.from_array(np.array(True))),
                          h.make_node("Loop", ["n", "t", "x"], ["xf", "y"], body=body)], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [4])],
                         [h.make_tensor_value_info("xf", T.FLOAT, [4]), h.make_tensor_value_info("y", T.INT32, [2, 4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("body_vi", [False, True])
def test_stale_value_info_of_an_input_does_not_type_it(body_vi: bool) -> None:
    # the value_info entry made Cast(x, int32) look like a same-type Cast: it was removed (truncation lost) and
    # fold's own validation then raised "fold produced a model that shape inference rejects ... a trtforge bug"
    from onnx.reference import ReferenceEvaluator

    m = _stale_input_value_info(body_vi)
    res = fold(m).model
    ops = [n.op_type for n in (res.graph.node[-1].attribute[0].g if body_vi else res.graph).node]
    assert "Cast" in ops
    x = {"x": np.array([1.5, -2.7, 3.9, -0.2], np.float32)}
    want, got = ReferenceEvaluator(m).run(None, x), ReferenceEvaluator(res).run(None, x)
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))


def test_quantization_annotation_keeps_naming_live_values() -> None:
    # b = Identity(a) carried a quantization annotation whose scale is the (otherwise unread) initializer s: fold
    # removed b and dropped s, leaving the annotation naming two values the model no longer has
    g = h.make_graph([h.make_node("Neg", ["x"], ["a"]), h.make_node("Identity", ["a"], ["b"]),
                      h.make_node("Abs", ["b"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])],
                     initializer=[nh.from_array(np.array(0.5, np.float32), "s")])
    ann = onnx.TensorAnnotation(tensor_name="b")
    ann.quant_parameter_tensor_names.append(onnx.StringStringEntryProto(key="SCALE_TENSOR", value="s"))
    g.quantization_annotation.append(ann)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    res = fold(m)
    out = res.model.graph
    assert [(n.op_type, list(n.output)) for n in out.node] == [("Neg", ["b"]), ("Abs", ["y"])]  # Identity still goes
    assert [t.name for t in out.initializer] == ["s"] and out.quantization_annotation[0].tensor_name == "b"
    assert res.report.removed == {"Identity": 1}
