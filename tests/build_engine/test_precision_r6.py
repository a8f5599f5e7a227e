"""trtforge precision, round 6: a Mul by a Pow whose exponent is computed from constants (Cast, Neg, Identity,
Reshape, Unsqueeze, ConstantOfShape, Sub of Constants) or cannot be proven non-negative, checked with onnx.reference
(real fp16 arithmetic; onnxruntime's CPU provider drops the fp32 -> fp16 -> fp32 Casts around its fp32 Mul, so it
never shows the overflow)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from trtforge.build_engine.precision.convert import convert_precision, node_decisions
from trtforge.build_engine.precision.policy import Mode

SHAPE = [4, 8]


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def _exponent(form: str, value: float) -> list[onnx.NodeProto]:
    """Nodes computing the exponent ``e`` (float32, value ``value``) from Constants, the way ``form`` says."""
    f32 = np.float32(value)
    return {
        "cast": [_const("c", np.float64(value)), helper.make_node("Cast", ["c"], ["e"], to=TensorProto.FLOAT)],
        "cast_int64": [_const("c", np.int64(value)), helper.make_node("Cast", ["c"], ["e"], to=TensorProto.FLOAT)],
        "neg": [_const("c", -f32), helper.make_node("Neg", ["c"], ["e"])],
        "identity": [_const("c", f32), helper.make_node("Identity", ["c"], ["e"])],
        "reshape": [_const("c", np.array([f32])), _const("s", np.array([1, 1], np.int64)),
                    helper.make_node("Reshape", ["c", "s"], ["e"])],
        "unsqueeze": [_const("c", f32), _const("ax", np.array([0], np.int64)),
                      helper.make_node("Unsqueeze", ["c", "ax"], ["e"])],
        "constant_of_shape": [_const("s", np.array([1], np.int64)),
                              helper.make_node("ConstantOfShape", ["s"], ["e"],
                                               value=numpy_helper.from_array(np.array([f32])))],
        "sub": [_const("a", f32 + 1), _const("b", np.float32(1)), helper.make_node("Sub", ["a", "b"], ["e"])],
    }[form]


FORMS = ("cast", "cast_int64", "neg", "identity", "reshape", "unsqueeze", "constant_of_shape", "sub")


def _scaled_power(exponent: list[onnx.NodeProto], inputs: tuple[str, ...] = ("x", "v")) -> onnx.ModelProto:
    """y = v * Pow(x, e): the exponent's nodes first; ``inputs`` are the float32 graph inputs."""
    nodes = [*exponent, helper.make_node("Pow", ["x", "e"], ["p"]), helper.make_node("Mul", ["v", "p"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _mul_mode(model: onnx.ModelProto, to: str = "fp16") -> Mode:
    at = next(i for i, n in enumerate(model.graph.node) if n.op_type == "Mul")
    return node_decisions(model, to)[at].mode


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with warnings.catch_warnings():  # onnx.reference warns when a Cast to fp16 overflows (the old code's inf)
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])


def test_a_mul_by_a_computed_negative_power_stays_fp32(rng: np.random.Generator) -> None:
    # old: only an initializer / Constant exponent was read, so v * Pow(x, Cast(Constant(-2))) (and Neg, Reshape,
    # Unsqueeze, ConstantOfShape, Sub of Constants) multiplied in fp16: x in [1e-3, 1e-2] gives x^-2 up to 1e6, cast
    # to fp16 as inf, so inf where fp32 gives values up to ~1e4; now the exponent is evaluated and the Mul stays fp32
    x = rng.uniform(1e-3, 1e-2, SHAPE).astype(np.float32)
    v = rng.uniform(1e-3, 1e-2, SHAPE).astype(np.float32) * rng.choice([-1, 1], SHAPE).astype(np.float32)
    for form in FORMS:
        model = _scaled_power(_exponent(form, -2.0))
        want = _run(model, {"x": x, "v": v})
        got = _run(convert_precision(model, "fp16").model, {"x": x, "v": v})
        assert np.all(np.isfinite(got)), form
        np.testing.assert_allclose(got, want, rtol=1e-3, err_msg=form)


def test_an_exponent_not_proven_non_negative_counts_as_negative(rng: np.random.Generator) -> None:
    # old: an exponent fed at run time, or computed by an op whose value is not evaluated (Exp), was no reciprocal:
    # fed e = -2 the fp16 Mul gave inf; now any exponent not proven non-negative keeps the Mul fp32
    runtime = _scaled_power([helper.make_node("Identity", ["e_in"], ["e"])], inputs=("x", "v", "e_in"))
    log_form = _scaled_power([_const("c", np.float32(np.log(2.0))), helper.make_node("Exp", ["c"], ["n"]),
                              helper.make_node("Neg", ["n"], ["e"])])
    assert _mul_mode(runtime) is Mode.KEEP and _mul_mode(log_form) is Mode.KEEP
    x = rng.uniform(1e-3, 1e-2, SHAPE).astype(np.float32)
    v = rng.uniform(1e-3, 1e-2, SHAPE).astype(np.float32)
    feeds = {"x": x, "v": v, "e_in": np.full(SHAPE, -2.0, np.float32)}
    for model, fed in ((runtime, feeds), (log_form, {"x": x, "v": v})):
        got = _run(convert_precision(model, "fp16").model, fed)
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, _run(model, fed), rtol=1e-3)


def test_a_computed_non_negative_exponent_is_still_converted() -> None:
    # an exponent computed from constants and proven >= 0 is no reciprocal: the Mul runs in fp16 as before, and bf16
    # (fp32's range) converts even the negative one. An int64 -> float32 Cast is not exact for every int64 (runtimes
    # round through float64 or not), so const_expr does not evaluate it: such an exponent counts as negative
    for form in FORMS:
        positive = Mode.KEEP if form == "cast_int64" else Mode.LOW
        assert _mul_mode(_scaled_power(_exponent(form, 2.0))) is positive, form
        assert _mul_mode(_scaled_power(_exponent(form, -2.0)), "bf16") is Mode.LOW, form
        assert _mul_mode(_scaled_power(_exponent(form, -2.0))) is Mode.KEEP, form


def _masked_softmax(value_nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    """y = Softmax(x + m * c): c (the mask value, float32) computed from Constants by ``value_nodes``."""
    nodes = [*value_nodes, helper.make_node("Mul", ["m", "c"], ["mk"]), helper.make_node("Add", ["x", "mk"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in "xm"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_a_mask_value_computed_from_a_wide_constant_stays_fp32(rng: np.random.Generator) -> None:
    # old: rule 8 read only float32 initializers / Constants, so a mask value beyond fp16 computed from one (Neg of
    # Constant(1e9), Cast of a double -1e9 literal, Reshape / Unsqueeze of one) was cast to fp16 as -inf by the Mul
    # reading it: 0 * -inf = NaN for every kept key, NaN rows out of Softmax where fp32 gives probabilities
    forms = {
        "neg": [_const("a", np.float32(1e9)), helper.make_node("Neg", ["a"], ["c"])],
        "cast_double": [_const("a", np.float64(-1e9)), helper.make_node("Cast", ["a"], ["c"], to=TensorProto.FLOAT)],
        "reshape": [_const("a", np.array([-1e9], np.float32)), _const("sh", np.array([1, 1], np.int64)),
                    helper.make_node("Reshape", ["a", "sh"], ["c"])],
        "unsqueeze": [_const("a", np.float32(-1e9)), _const("ax", np.array([0], np.int64)),
                      helper.make_node("Unsqueeze", ["a", "ax"], ["c"])],
    }
    x = rng.standard_normal(SHAPE).astype(np.float32)
    m = (rng.uniform(size=SHAPE) < 0.5).astype(np.float32)
    m[:, 0] = 0.0  # every row keeps a key ...
    m[1] = 1.0     # ... except one, masked whole (fp32: uniform over the row)
    for form, nodes in forms.items():
        model = _masked_softmax(nodes)
        want = _run(model, {"x": x, "m": m})
        got = _run(convert_precision(model, "fp16").model, {"x": x, "m": m})
        assert np.all(np.isfinite(got)), form
        np.testing.assert_allclose(got, want, atol=2e-3, err_msg=form)
