"""Held-out fold cases, round 4: model parts outside the inference graph that fold must keep meaning what they
meant (training_info's state)."""

from __future__ import annotations

import numpy as np
import onnx
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
