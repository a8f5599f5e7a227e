"""trtforge precision, round 5: held-out models whose fp16 graph computed something else than the source, checked
with onnx.reference (real fp16 arithmetic; onnxruntime's CPU provider runs fp16 Mul through float32)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from trtforge.build_engine.precision.convert import convert_precision

H = 16


def _rmsnorm_by_mul(rng: np.random.Generator) -> onnx.ModelProto:
    """h = x @ w, then an RMSNorm whose square is written Mul(h, h) (as ``h * h`` exports): y = h / sqrt(mean(h*h))."""
    w = rng.standard_normal((H, H)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Mul", ["h", "h"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["r"]),
             helper.make_node("Div", ["h", "r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, H])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, H])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(1e-5), "eps")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_square_written_as_mul_stays_fp32(rng: np.random.Generator) -> None:
    # old: Mul(h, h) ran in fp16, so h beyond 256 squared to inf and the norm returned 0 (or NaN) where fp32 gives
    # values of size ~1; now the square runs in fp32 like Pow(h, 2), and the result is fp32's within fp16 rounding
    model = _rmsnorm_by_mul(rng)
    x = (rng.standard_normal((2, H)) * 200).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert np.abs(x @ numpy_helper.to_array(model.graph.initializer[0])).max() > 256
    result = convert_precision(model, "fp16")
    kinds = {n.output[0]: n for n in result.model.graph.node}
    assert "sq" in kinds and kinds["sq"].op_type == "Mul"
    got = ReferenceEvaluator(result.model).run(None, {"x": x})[0]
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-2 * np.abs(want).max())


def _eye_matmuls(nodes: list[onnx.NodeProto], out: str) -> onnx.ModelProto:
    """m = m2 = x @ I (x [2, 4]) followed by ``nodes`` computing ``out``."""
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]),
                               helper.make_node("MatMul", ["x", "w"], ["m2"]), *nodes], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_constants_written_as_value_float_are_judged_like_tensors(rng: np.random.Generator) -> None:
    # old: rules 8 and 10 read only a Constant's ``value`` tensor: an epsilon Constant(value_float=1e-12) became fp16 0
    # (0 / sqrt(0) = NaN where fp32 gives 0), and Constant(value_float=1e5) became inf (m * k - k: NaN everywhere)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    x[0, 1:] = 0.0
    for attr, eps in (("value_float", 1e-12), ("value_floats", [1e-12])):
        model = _eye_matmuls([helper.make_node("Mul", ["m", "m2"], ["sq"]),
                              helper.make_node("Constant", [], ["eps"], **{attr: eps}),
                              helper.make_node("Add", ["sq", "eps"], ["se"]), helper.make_node("Sqrt", ["se"], ["r"]),
                              helper.make_node("Div", ["m", "r"], ["y"])], "y")
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        got = ReferenceEvaluator(convert_precision(model, "fp16").model).run(None, {"x": x})[0]
        assert not np.isnan(got).any(), attr
        np.testing.assert_allclose(got, want, atol=2e-3)
    model = _eye_matmuls([helper.make_node("Constant", [], ["k"], value_float=1e5),
                          helper.make_node("Mul", ["m", "k"], ["mk"]),
                          helper.make_node("Sub", ["mk", "k"], ["y"])], "y")
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = ReferenceEvaluator(convert_precision(model, "fp16").model).run(None, {"x": x})[0]
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-3)


def test_a_constant_beyond_fp16_converts_without_a_warning(tmp_path) -> None:
    # old: rule 10's check cast every small constant to fp16, so a mask constant of -1e9 printed NumPy's two-line
    # 'RuntimeWarning: overflow encountered in cast' on the stderr of a conversion that succeeded
    from trtforge_testing import run_console

    model = _eye_matmuls([helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32(-1e9))),
                          helper.make_node("Add", ["m", "k"], ["y"])], "y")
    src, out = tmp_path / "m.onnx", tmp_path / "m16.onnx"
    onnx.save(model, src)
    res = run_console(["precision", str(src), "-o", str(out), "--to", "fp16"])
    assert res.code == 0 and res.err == "", res.err
    got = ReferenceEvaluator(str(out)).run(None, {"x": np.ones((2, 4), np.float32)})[0]
    np.testing.assert_array_equal(got, np.full((2, 4), np.float32(1) + np.float32(-1e9)))  # kept fp32 (rule 8)


def test_a_mul_by_a_reciprocal_norm_stays_fp32(rng: np.random.Generator) -> None:
    # old: RMSNorm written x * Reciprocal(Sqrt(mean(x^2) + 1e-12)) (as x * rsqrt(...) exports) multiplied in fp16, so
    # 1 / rms of a row with rms below 1.5e-5 (a near-zero or zero row) was cast to inf: +-inf (or NaN) where fp32
    # gives values of size ~1; Div(x, Sqrt(...)) stayed fp32 already, and now the Mul does too
    w = np.eye(H, dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Pow", ["h", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]), helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["r"]), helper.make_node("Reciprocal", ["r"], ["rs"]),
             helper.make_node("Mul", ["h", "rs"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(2), "two"),
             numpy_helper.from_array(np.float32(1e-12), "eps")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, H])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.standard_normal((3, H)).astype(np.float32)
    x[0] *= 1e-5  # rms ~1e-5: 1 / rms ~1e5
    x[1] = 0.0    # 1 / sqrt(1e-12) = 1e6, times 0
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = ReferenceEvaluator(convert_precision(model, "fp16").model).run(None, {"x": x})[0]
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2)
    # torch's rsqrt export: Div(1, Sqrt(...)) in place of the Reciprocal
    nodes[5] = helper.make_node("Div", ["one", "r"], ["rs"])
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    model.graph.initializer.append(numpy_helper.from_array(np.float32(1), "one"))
    got = ReferenceEvaluator(convert_precision(model, "fp16").model).run(None, {"x": x})[0]
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2)


def test_sequence_ops_keep_their_types(rng: np.random.Generator) -> None:
    # old: --to fp16 converted SequenceConstruct's elements (its schema admits float16), so a model returning a
    # sequence of float32 tensors, or reading one back with SequenceAt, was refused as 'precision conversion to fp16
    # produced an invalid model' (exit 2) on a valid model; now ops with sequence / optional I/O keep the source's types
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("SequenceConstruct", ["a", "b"], ["seq"]),
             helper.make_node("SequenceAt", ["seq", "one"], ["picked"]), helper.make_node("Neg", ["picked"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [w, numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    want_seq, want_y = ReferenceEvaluator(model).run(None, {"x": x})
    for to in ("fp16", "bf16"):
        out = convert_precision(model, to).model
        got_seq, got_y = ReferenceEvaluator(out).run(None, {"x": x})
        assert [t.dtype for t in got_seq] == [np.float32, np.float32] and got_y.dtype == np.float32
        for got, want in zip([*got_seq, got_y], [*want_seq, want_y], strict=True):
            np.testing.assert_allclose(got, want, atol=5e-2, rtol=2e-2)


def _norm_by_pow(exponent: onnx.NodeProto | onnx.TensorProto, centred: bool) -> onnx.ModelProto:
    """h = x @ I; y = c * Pow(mean(c^2) + 1e-12, e), c = h (an RMSNorm) or h - mean(h) (a LayerNorm decomposition);
    the exponent e is an initializer or a Constant node."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("ReduceMean", ["h"], ["mu"], axes=[-1]),
             helper.make_node("Sub", ["h", "mu"], ["c"]) if centred else helper.make_node("Identity", ["h"], ["c"]),
             helper.make_node("Pow", ["c", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Pow", ["mse", "e"], ["rs"]),
             helper.make_node("Mul", ["c", "rs"], ["y"])]
    inits = [numpy_helper.from_array(np.eye(H, dtype=np.float32), "w"), numpy_helper.from_array(np.float32(2), "two"),
             numpy_helper.from_array(np.float32(1e-12), "eps")]
    if isinstance(exponent, onnx.NodeProto):
        nodes.insert(0, exponent)
    else:
        inits.append(exponent)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, H])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, H])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_mul_by_a_negative_power_norm_stays_fp32(rng: np.random.Generator) -> None:
    # old: the same norm written x * Pow(mean(x^2) + 1e-12, -0.5) (the rsqrt form several exporters write; a
    # LayerNorm decomposition's (x - mean) * Pow(var + eps, -0.5) too) multiplied in fp16: 1 / rms of a row with rms
    # below 1.5e-5 was cast to inf, so +-inf / NaN where fp32 gives values of size ~1; now the Mul stays fp32
    exponents = [numpy_helper.from_array(np.float32(-0.5), "e"),
                 numpy_helper.from_array(np.array([-0.5], np.float32), "e"), numpy_helper.from_array(np.int64(-1), "e"),
                 helper.make_node("Constant", [], ["e"], value_float=-0.5),
                 helper.make_node("Constant", [], ["e"], value_floats=[-0.5]),
                 helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(np.float32(-0.5)))]
    x = rng.standard_normal((3, H)).astype(np.float32)
    x[0] *= 1e-5  # rms ~1e-5: 1 / rms ~1e5
    x[1] = 0.0    # 1 / sqrt(1e-12) = 1e6, times 0
    for exponent in exponents:
        for centred in (False, True):
            model = _norm_by_pow(exponent, centred)
            want = ReferenceEvaluator(model).run(None, {"x": x})[0]
            got = ReferenceEvaluator(convert_precision(model, "fp16").model).run(None, {"x": x})[0]
            assert np.all(np.isfinite(got)), (exponent.name, centred)
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * max(1.0, np.abs(want).max()))


def test_a_mul_by_a_positive_power_is_still_converted() -> None:
    # a Pow to a positive exponent is no reciprocal: x * Pow(mean(x^2) + eps, 0.5) multiplies in fp16 as before,
    # and bf16 (fp32's range) converts the negative-power Mul as before
    from trtforge.build_engine.precision.convert import node_decisions
    from trtforge.build_engine.precision.policy import Mode

    def mul_mode(value: float, to: str) -> Mode:
        model = _norm_by_pow(numpy_helper.from_array(np.float32(value), "e"), centred=False)
        at = next(i for i, n in enumerate(model.graph.node) if n.op_type == "Mul")
        return node_decisions(model, to)[at].mode

    assert mul_mode(-0.5, "fp16") is Mode.KEEP
    assert mul_mode(0.5, "fp16") is Mode.LOW
    assert mul_mode(-0.5, "bf16") is Mode.LOW
