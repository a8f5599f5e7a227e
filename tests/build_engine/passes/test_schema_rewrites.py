"""A rewrite never leaves a node whose input type its op's schema, at the model's opset, does not accept.

``sink_cast`` moves an exact Cast past data-movement ops, so those ops then read the Cast's source type. Built at
every default-domain opset from 7 to the installed onnx's newest, for sources the schemas accept at some opsets and
not at others (int16/uint8 into Flatten before opset 9, bfloat16 before 13), each fold must pass ``onnx.checker``
and strict shape inference (``fold`` raises otherwise) and keep every output bit.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.passes import fold
from trtforge.build_engine.passes.schema import accepts

OPSETS = list(range(7, onnx.defs.onnx_opset_version() + 1))
SOURCES = [(T.INT16, T.FLOAT), (T.UINT8, T.FLOAT), (T.INT32, T.DOUBLE), (T.BFLOAT16, T.FLOAT), (T.FLOAT16, T.FLOAT)]


def _moves(opset: int) -> dict[str, tuple[list[onnx.NodeProto], list[onnx.TensorProto]]]:
    """Data-movement ops between the two Casts, reading ``a`` and writing ``b`` (shape [2, 3] -> [2, 3])."""
    shape = nh.from_array(np.array([2, 3], np.int64), "shape")
    reps = nh.from_array(np.array([1, 1], np.int64), "reps")
    idx = nh.from_array(np.array([1, 0], np.int64), "idx")
    return {
        "Flatten": ([h.make_node("Flatten", ["a"], ["b"])], []),
        "Transpose": ([h.make_node("Transpose", ["a"], ["t"], perm=[1, 0]),
                       h.make_node("Transpose", ["t"], ["b"], perm=[1, 0])], []),
        "Identity": ([h.make_node("Identity", ["a"], ["b"])], []),
        "Reshape": ([h.make_node("Reshape", ["a", "shape"], ["b"])], [shape]),
        "Tile": ([h.make_node("Tile", ["a", "reps"], ["b"])], [reps]),
        "Gather": ([h.make_node("Gather", ["a", "idx"], ["b"], axis=0)], [idx]),
        "Expand": ([h.make_node("Expand", ["a", "shape"], ["b"])], [shape]) if opset >= 8 else
        ([h.make_node("Identity", ["a"], ["b"])], []),
    }


def _model(src: int, mid: int, opset: int, op: str) -> onnx.ModelProto:
    nodes, inits = _moves(opset)[op]
    nodes = [h.make_node("Cast", ["x"], ["a"], to=mid), *nodes, h.make_node("Cast", ["b"], ["y"], to=src)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", src, [2, 3])],
                     [h.make_tensor_value_info("y", src, [2, 3])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 3 if opset < 8 else 4 if opset < 11 else 8
    return m


@pytest.mark.parametrize("opset", OPSETS)
def test_sink_cast_is_schema_valid_at_every_opset(opset: int) -> None:
    from onnx.reference import ReferenceEvaluator

    for src, mid in SOURCES:
        for op in _moves(opset):
            m = _model(src, mid, opset, op)
            try:
                onnx.checker.check_model(m, full_check=True)
            except Exception:
                continue  # the source type is not valid for Cast/this op at this opset: nothing to fold
            res = fold(m)  # raises CheckFailed when the result fails the checker or strict inference
            onnx.shape_inference.infer_shapes(res.model, check_type=True, strict_mode=True)
            moved = [n for n in res.model.graph.node if n.op_type != "Cast"]
            for n in moved:
                if n.op_type == op and res.report.rules.get("sink_cast"):
                    assert accepts(op, "", opset, [src]), (op, opset, src)
            x = (np.arange(6).reshape(2, 3) * 37 - 50).astype(onnx.helper.tensor_dtype_to_np_dtype(src))
            if opset >= 13 or src != T.BFLOAT16:
                a = ReferenceEvaluator(m).run(None, {"x": x})[0]
                b = ReferenceEvaluator(res.model).run(None, {"x": x})[0]
                assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8)), (op, opset, src)


def test_int16_into_flatten_at_opset_8_folds_without_error() -> None:
    m = _model(T.INT16, T.FLOAT, 8, "Flatten")
    onnx.checker.check_model(m, full_check=True)
    res = fold(m)
    assert [n.op_type for n in res.model.graph.node] == ["Cast", "Flatten", "Cast"]  # Flatten-1 takes floats only
    res9 = fold(_model(T.INT16, T.FLOAT, 9, "Flatten"))
    assert [n.op_type for n in res9.model.graph.node] == ["Flatten"]  # Flatten-9 takes every type


def test_accepts_reads_the_schema() -> None:
    assert not accepts("Flatten", "", 8, [T.INT16]) and accepts("Flatten", "", 9, [T.INT16])
    assert not accepts("Reshape", "", 12, [T.BFLOAT16, T.INT64]) and accepts("Reshape", "", 13, [T.BFLOAT16, T.INT64])
    assert not accepts("Reshape", "", 13, [T.FLOAT, T.INT32])  # shape must be int64
    assert not accepts("Add", "", 13, [T.FLOAT, T.DOUBLE])  # one type variable, two types
    assert not accepts("NoSuchOp", "", 13, [T.FLOAT])
