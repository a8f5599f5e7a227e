"""Constant Cast folding, Shape(Cast), duplicate Casts, Casts moved through data movement, Gather index Casts."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

F, F16, F64, BF16, I8, I32, I64, B = T.FLOAT, T.FLOAT16, T.DOUBLE, T.BFLOAT16, T.INT8, T.INT32, T.INT64, T.BOOL


def cast(i: str, o: str, to: int):
    return h.make_node("Cast", [i], [o], to=to)


@pytest.mark.parametrize(("src", "to", "values"), [
    (F, F16, [0.1, -0.0, 65519.0, 65520.0, 1e-8, np.inf, np.nan, 2049.0]),
    (F64, F16, [0.25, 1 + 2.0**-11, -(2.0**100), 2.0**-30]),
    (I64, BF16, [2**24 + 2**16, -5, 257]),
    (F, BF16, [0.1, 1.00390625, -7e20, np.nan, -0.0]),
    (F, I32, [1.9, -1.9, -0.0, 2.5e9 * 0 + 12345.7]),
    (I64, F, [2**24 + 1, -(2**40) - 3, 7]),
    (I32, F16, [2049, 65519, -3]),
    (F, B, [0.0, -0.0, 3.5]),
    (I64, I32, [5, -7, 2**31 - 1]),
    (B, F, [True, False]),
])
def test_constant_cast_folded_exactly(kit, folded, src: int, to: int, values: list) -> None:
    arr = np.array(values, dtype=h.tensor_dtype_to_np_dtype(src))
    m = kit.make_model([cast("c", "a", to), h.make_node("Concat", ["a", "x"], ["y"], axis=0)],
                       [("x", to, [2])], [("y", to, [len(values) + 2])], [nh.from_array(arr, "c")])
    out, rep = folded(m)
    assert kit.ops(out) == ["Concat"] and rep["rules"]["constant_cast"] == 1


@pytest.mark.parametrize(("src", "to", "values"), [
    (F, I32, [1.5, 3e9]), (F, I8, [200.0]), (F, I32, [np.nan]), (F16, I64, [np.inf]), (I64, I32, [2**40]),
    (I32, T.UINT8, [-1]), (F, B, [np.nan]),
    (F64, F16, [1 + 2.0**-11 + 2.0**-40]), (F64, BF16, [1 + 2.0**-8 + 2.0**-40]), (I64, BF16, [2**24 + 2**16 + 1]),
    (I64, F, [2**60 + 1]), (F, T.FLOAT8E4M3FN, [1.0]),
])
def test_constant_cast_left_to_runtime_when_out_of_range(kit, folded, src: int, to: int, values: list) -> None:
    arr = np.array(values, dtype=h.tensor_dtype_to_np_dtype(src))
    m = kit.make_model([cast("c", "a", to), h.make_node("Concat", ["a", "x"], ["y"], axis=0)],
                       [("x", to, [2])], [("y", to, [len(values) + 2])], [nh.from_array(arr, "c")])
    out, rep = folded(m)
    assert kit.ops(out) == ["Cast", "Concat"] and "constant_cast" not in rep["rules"]


def test_constant_node_cast_folded_and_graph_output_name_kept(kit, folded) -> None:
    c = h.make_node("Constant", [], ["c"], value=nh.from_array(np.array([1.25, -2.0], np.float32)))
    m = kit.make_model([c, cast("c", "y", F16)], [], [("y", F16, [2])])
    out, _ = folded(m)
    assert kit.ops(out) == ["Constant"] and out.graph.node[0].output[0] == "y"


def test_initializer_that_is_graph_input_not_folded(kit, folded) -> None:
    m = kit.make_model([cast("c", "a", F64), h.make_node("Neg", ["a"], ["y"])], [("c", F, [2])],
                       [("y", F64, [2])], [nh.from_array(np.array([1.0, 2.0], np.float32), "c")])
    out, _ = folded(m)
    assert kit.ops(out) == ["Cast", "Neg"]


def test_shape_of_cast(kit, folded) -> None:
    m = kit.make_model([cast("x", "a", F16), h.make_node("Shape", ["a"], ["y"])], [("x", F, [2, 3])],
                       [("y", I64, [2])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Shape"] and rep["rules"]["shape_of_cast"] == 1


def test_duplicate_sibling_casts_merged(kit, folded) -> None:
    m = kit.make_model([cast("x", "a", F16), cast("x", "b", F16), h.make_node("Add", ["a", "b"], ["y"])],
                       [("x", F, [4])], [("y", F16, [4])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Cast", "Add"] and rep["rules"]["duplicate_cast"] == 1


def test_duplicate_casts_that_are_both_outputs_kept(kit, folded) -> None:
    m = kit.make_model([cast("x", "a", F16), cast("x", "b", F16)], [("x", F, [4])],
                       [("a", F16, [4]), ("b", F16, [4])])
    out, _ = folded(m)
    assert kit.ops(out) == ["Cast", "Cast"]


def test_cast_moved_through_data_movement_collapses(kit, folded) -> None:
    shape = nh.from_array(np.array([3, 2], np.int64), "shape")
    m = kit.make_model([cast("x", "a", F), h.make_node("Reshape", ["a", "shape"], ["b"]),
                        h.make_node("Transpose", ["b"], ["c"], perm=[1, 0]), cast("c", "d", F16),
                        h.make_node("Neg", ["d"], ["y"])], [("x", F16, [2, 3])], [("y", F16, [2, 3])], [shape])
    out, rep = folded(m)
    assert kit.ops(out) == ["Reshape", "Transpose", "Neg"] and rep["rules"]["sink_cast"] == 1


def test_cast_not_moved_through_lossy_pair(kit, folded) -> None:
    m = kit.make_model([cast("x", "a", F16), h.make_node("Transpose", ["a"], ["b"], perm=[1, 0]),
                        cast("b", "y", F)], [("x", F, [2, 3])], [("y", F, [3, 2])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Cast", "Transpose", "Cast"] and not rep["rules"]


def test_cast_not_moved_when_intermediate_has_other_reader(kit, folded) -> None:
    m = kit.make_model([cast("x", "a", F), h.make_node("Transpose", ["a"], ["b"], perm=[1, 0]),
                        cast("b", "y", F16), h.make_node("Neg", ["b"], ["z"])], [("x", F16, [2, 3])],
                       [("y", F16, [3, 2]), ("z", F, [3, 2])])
    out, _ = folded(m)
    assert kit.ops(out).count("Cast") == 2


def test_gather_index_cast_removed_only_when_widening(kit, folded) -> None:
    data = nh.from_array(np.arange(20, dtype=np.float32).reshape(10, 2), "data")
    ten = nh.from_array(np.array(10, np.int32), "ten")
    m = kit.make_model([h.make_node("Mod", ["i", "ten"], ["ia"]), cast("ia", "j", I64),
                        h.make_node("Gather", ["data", "j"], ["y"])], [("i", I32, [4])], [("y", F, [4, 2])],
                       [data, ten])
    out, rep = folded(m)
    assert "Cast" not in kit.ops(out) and rep["rules"]["gather_index_cast"] == 1


def test_gather_index_narrowing_cast_kept(kit, folded) -> None:
    data = nh.from_array(np.arange(20, dtype=np.float32).reshape(10, 2), "data")
    ten = nh.from_array(np.array(10, np.int64), "ten")
    m = kit.make_model([h.make_node("Mod", ["i", "ten"], ["ia"]), cast("ia", "j", I32),
                        h.make_node("Gather", ["data", "j"], ["y"])], [("i", I64, [4])], [("y", F, [4, 2])],
                       [data, ten])
    out, rep = folded(m)
    assert "Cast" in kit.ops(out) and not rep["rules"]


def _old_model(nodes, inputs, outputs, inits, opset: int, ir: int) -> onnx.ModelProto:
    vi = h.make_tensor_value_info
    g = h.make_graph(nodes, "g", [vi(*i) for i in inputs], [vi(*o) for o in outputs], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = ir
    onnx.checker.check_model(m, full_check=True)
    return m


def test_constant_cast_below_ir_4_stays_a_constant_node(folded) -> None:
    # IR 3: every initializer must also be a graph input; the folded Cast became one that was not ("kf in initializer
    # but not in graph input": fold failed, exit 1, "this is a trtforge bug")
    k = nh.from_array(np.array([1.0, 2.5, -0.0, 1e300], np.float64))
    for opset in (7, 8):
        m = _old_model([h.make_node("Constant", [], ["k"], value=k), cast("k", "kf", F),
                        h.make_node("Add", ["x", "kf"], ["y"])], [("x", F, [4])], [("y", F, [4])], [], opset, 3)
        out, rep = folded(m)
        onnx.checker.check_model(out, full_check=True)
        assert [n.op_type for n in out.graph.node] == ["Constant", "Add"] and not out.graph.initializer
        assert rep["rules"]["constant_cast"] == 1


def test_no_constant_node_of_a_type_its_opset_does_not_hold(folded) -> None:
    # Constant-1 (opsets 1-8) holds float16/float/double only: an int64 Cast result into a graph output, or an int64
    # constant expression kept for another reader, was written as an int64 Constant that inference rejects
    k = nh.from_array(np.array([1.0, 2.0, 3.0, 4.0], np.float64), "k")
    i = nh.from_array(np.array([1, 2, 3, 4], np.int64), "i")
    nodes = [cast("k", "y", I64), h.make_node("Add", ["i", "i"], ["i2"]), cast("i2", "f", F),
             h.make_node("Add", ["x", "f"], ["z"]), h.make_node("Mul", ["i2", "i"], ["w"])]
    for opset in (7, 8, 9):
        m = _old_model(nodes, [("x", F, [4])], [("y", I64, [4]), ("z", F, [4]), ("w", I64, [4])], [k, i], opset, 4)
        out, _ = folded(m)
        onnx.checker.check_model(out, full_check=True)
        consts = [n for n in out.graph.node if n.op_type == "Constant"]
        assert all(c.attribute[0].t.data_type != I64 for c in consts) if opset < 9 else len(consts) == 2
