"""Round-4 QA regressions for trtforge quantize."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.quantize import QuantConfig, quantize
from trtforge.build_engine.quantize.calib_data import load_npz
from trtforge.plugins.lora.inject import inject

H = 16


def _lora_model_with_a_cache_input(rng: np.random.Generator) -> onnx.ModelProto:
    """Inputs ``kv`` [b, 4, 8] (listed first) and ``x`` [b, s, H]; q_proj adapted, so ``lora_slot_ids`` is [b, s]."""
    q = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "l.q_proj.weight")
    k = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "l.k_proj.weight")
    nodes = [helper.make_node("MatMul", ["x", q.name], ["q"], name="/l/q_proj/MatMul"),
             helper.make_node("ReduceSum", ["kv"], ["kvs"], keepdims=0),
             helper.make_node("MatMul", ["q", k.name], ["k"], name="/l/k_proj/MatMul"),
             helper.make_node("Relu", ["k"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("kv", TensorProto.FLOAT, ["b", 4, 8]),
                                       helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", H]),
                           helper.make_tensor_value_info("kvs", TensorProto.FLOAT, [])], [q, k])
    return inject(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), ["q_proj"], 4, 2)


def test_calib_file_slot_ids_take_their_dims_by_name(tmp_path: Path, rng: np.random.Generator) -> None:
    # old: the left-out lora_slot_ids got the first array's leading dims (kv: [1, 4]) instead of x's [1, 6], and
    # calibration failed in onnxruntime ("right operand cannot broadcast"), exit 2, on a valid file
    model = _lora_model_with_a_cache_input(rng)
    path = tmp_path / "calib.npz"
    np.savez(path, kv=rng.standard_normal((3, 1, 4, 8)).astype(np.float32),
             x=rng.standard_normal((3, 1, 6, H)).astype(np.float32))
    calib = load_npz(path, model)
    assert [s["lora_slot_ids"].shape for s in calib.samples] == [(1, 6)] * 3
    assert all((s["lora_slot_ids"] == -1).all() for s in calib.samples)
    report = quantize(model, QuantConfig(mode="int8"), calib).report
    assert [n.name for n in report.nodes] == ["/l/q_proj/MatMul", "/l/k_proj/MatMul"]


def test_projections_inside_an_if_body_are_reported_as_kept_float(rng: np.random.Generator) -> None:
    # old: the If body's MatMuls (one with its own weight, one reading the main graph's) stayed float and the report
    # listed neither (excluded was empty); now each is excluded with the reason
    from trtforge.build_engine.quantize import CalibSet

    w = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "w")
    wb = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "w_body")
    out_t = [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n", H])]
    out_e = [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n", H])]
    then = helper.make_graph([helper.make_node("MatMul", ["a", "w_body"], ["t"], name="then_mm")], "then", [], out_t,
                             [wb])
    other = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["e"], name="else_mm")], "else", [], out_e)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a0"], name="mm"), helper.make_node("Relu", ["a0"], ["a"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", H]),
                                       helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", H])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    samples = tuple({"x": rng.standard_normal((3, H)).astype(np.float32), "c": np.array(flag)}
                    for flag in (True, False))
    report = quantize(model, QuantConfig(mode="int8"), CalibSet(samples, "test")).report
    assert [n.name for n in report.nodes] == ["mm"]
    reasons = {e.name: e.reason for e in report.excluded}
    assert sorted(reasons) == ["else_mm", "then_mm"]
    assert "inside the subgraph 'then'" in reasons["then_mm"] and "stays float" in reasons["then_mm"]
