"""precision rule 9: an Identity is a copy. A pass-through ``y = Identity(x)`` of a float32 input and output was
rounded through the low type (70000 -> inf, 1e-8 -> 0 in fp16); between two converted nodes the converted graph
computes exactly what it computed before (the Identity reads through an exact low -> fp32 -> low round trip)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from trtforge.build_engine.precision.convert import convert_precision
from trtforge_testing import graph_model, seeded_rng


def _outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with np.errstate(over="ignore", invalid="ignore"):  # x * 1e5 overflows the fp16 MatMul: not checked
        return list(ReferenceEvaluator(model).run(None, feeds))


@pytest.mark.parametrize("to", ["fp16", "bf16"])
def test_a_pass_through_identity_keeps_its_bits(to: str) -> None:
    rng = seeded_rng(f"precision-identity-{to}")
    w = nh.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    m = graph_model([h.make_node("Identity", ["x"], ["y"]), h.make_node("MatMul", ["x", "w"], ["z"])],
                    [("x", T.FLOAT, [2, 4])], [("y", T.FLOAT, [2, 4]), ("z", T.FLOAT, [2, 4])], [w])
    onnx.checker.check_model(m, full_check=True)
    res = convert_precision(m, to)
    x = rng.standard_normal((2, 4)).astype(np.float32) * np.float32(1e5)
    x[0, :2] = [np.float32(1e-8), np.float32(3.14159265)]
    y, z = _outputs(res.model, {"x": x})
    assert y.dtype == np.float32 and np.array_equal(y.view(np.uint32), x.view(np.uint32))
    low = next(n for n in res.model.graph.node if n.op_type == "MatMul")
    assert low.input[0].endswith(f"__{to}")  # the MatMul still runs in the low type
    assert res.report.nodes_low == 1


def test_an_identity_between_converted_nodes_changes_nothing() -> None:
    rng = seeded_rng("precision-identity-mid")
    w = nh.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    mid = [h.make_node("MatMul", ["x", "w"], ["a"]), h.make_node("Identity", ["a"], ["b"]),
           h.make_node("Relu", ["b"], ["y"])]
    direct = [h.make_node("MatMul", ["x", "w"], ["a"]), h.make_node("Relu", ["a"], ["y"])]
    io = ([("x", T.FLOAT, [3, 8])], [("y", T.FLOAT, [3, 8])])
    with_id, without = (convert_precision(graph_model(n, *io, [w]), "fp16").model for n in (mid, direct))
    assert not any(n.op_type == "Identity" for n in with_id.graph.node)  # fold removed it and its round trip
    for _ in range(3):
        x = (rng.standard_normal((3, 8)) * 30).astype(np.float32)
        a, b = _outputs(with_id, {"x": x})[0], _outputs(without, {"x": x})[0]
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("op,attrs", [("GlobalAveragePool", {}), ("AveragePool", {"kernel_shape": [2, 2]}),
                                      ("GlobalLpPool", {}), ("LpPool", {"kernel_shape": [2, 2]})])
def test_pooling_reductions_stay_fp32(op: str, attrs: dict) -> None:
    """README: reductions are kept in fp32. Pooling averages (and Lp norms) over windows are reductions, yet ran in
    fp16 (a window of values near 65504 sums past fp16's range; Lp pooling squares them first)."""
    rng = seeded_rng(f"precision-pool-{op}")
    w = nh.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w")
    m = graph_model([h.make_node("Conv", ["x", "w"], ["c"]), h.make_node(op, ["c"], ["y"], **attrs)],
                    [("x", T.FLOAT, [1, 3, 4, 4])], [("y", T.FLOAT, ["a", "b", "c", "d"])], [w])
    res = convert_precision(m, "fp16")
    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in [*res.model.graph.value_info, *res.model.graph.input, *res.model.graph.output]}
    pool = next(n for n in res.model.graph.node if n.op_type == op)
    conv = next(n for n in res.model.graph.node if n.op_type == "Conv")
    assert types.get(pool.input[0], T.FLOAT) == T.FLOAT and not pool.input[0].endswith("__fp16")
    assert conv.input[0].endswith("__fp16")  # the Conv still runs in fp16
    x = (rng.standard_normal((1, 3, 4, 4)) * 10).astype(np.float32)
    import onnxruntime as ort  # onnx.reference has no GlobalLpPool

    ref, got = (ort.InferenceSession(mm.SerializeToString()).run(None, {"x": x})[0] for mm in (m, res.model))
    assert np.allclose(got, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
