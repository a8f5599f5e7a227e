"""``fold --check`` always gives a verdict: onnx.reference, onnxruntime where onnx.reference cannot run the model,
or exit 2 naming the op; inputs reach every value class; Loop/If bodies that changed are executed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.passes import fold
from trtforge.build_engine.passes.base import GraphPass
from trtforge.build_engine.passes.ir import GraphCtx
from trtforge.build_engine.verify.bitwise import CannotCheck, check_equivalent
from trtforge.build_engine.verify.fold_feeds import extreme_inputs
from trtforge_testing import assert_fold_check_refused, assert_one_line_error, counting_loop, graph_model


def _minilm_like_fp16_with_contrib_ops() -> onnx.ModelProto:
    """An fp16 encoder block as onnxruntime's transformer optimizer leaves it (com.microsoft SkipLayerNormalization
    and FastGelu, which onnx.reference does not implement), with autocast-style Cast round trips around it."""
    rng = np.random.default_rng(0)
    hid = 8
    w = nh.from_array((rng.standard_normal((hid, hid)) * 0.3).astype(np.float16), "w")
    gamma = nh.from_array(np.ones(hid, np.float16), "gamma")
    beta = nh.from_array(np.zeros(hid, np.float16), "beta")
    nodes = [h.make_node("Cast", ["x"], ["x32"], to=T.FLOAT), h.make_node("Cast", ["x32"], ["x16"], to=T.FLOAT16),
             h.make_node("MatMul", ["x16", "w"], ["mm"]), h.make_node("Identity", ["mm"], ["mmi"]),
             h.make_node("SkipLayerNormalization", ["mmi", "x16", "gamma", "beta"], ["ln"], domain="com.microsoft",
                         epsilon=1e-5),
             h.make_node("FastGelu", ["ln"], ["g"], domain="com.microsoft"),
             h.make_node("Cast", ["g"], ["g32"], to=T.FLOAT), h.make_node("Cast", ["g32"], ["y"], to=T.FLOAT16)]
    return graph_model(nodes, [("x", T.FLOAT16, ["batch", 4, hid])], [("y", T.FLOAT16, ["batch", 4, hid])],
                  [w, gamma, beta], (("", 17), ("com.microsoft", 1)))


def test_onnxruntime_judges_where_onnx_reference_cannot_run_the_model() -> None:
    m = _minilm_like_fp16_with_contrib_ops()
    res = fold(m)
    assert res.report.removed == {"Cast": 2, "Identity": 1}  # fp16->fp32->fp16 round trip: exact
    chk = check_equivalent(m, res.model)
    assert chk.passed and chk.runtime == "onnxruntime" and chk.runs >= 4


def test_no_runtime_runs_it_exit_2_naming_the_op(cli, tmp_path: Path) -> None:
    nodes = [h.make_node("Identity", ["x"], ["xi"]), h.make_node("Mystery", ["xi"], ["y"], domain="acme")]
    m = graph_model(nodes, [("x", T.FLOAT, [3])], [("y", T.FLOAT, [3])], opsets=(("", 17), ("acme", 1)))
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(m, src)
    res = cli("fold", src, "-o", out, "--check")
    assert_one_line_error(res, 2, "could not check this model", "op Mystery")
    assert not out.exists()
    with pytest.raises(CannotCheck):
        check_equivalent(m, fold(m).model)


def test_value_classes_cover_specials_and_extremes() -> None:
    m = graph_model([h.make_node("Identity", ["f"], ["y"]), h.make_node("Identity", ["i"], ["z"])],
               [("f", T.FLOAT16, [64]), ("i", T.UINT32, [64])], [("y", T.FLOAT16, [64]), ("z", T.UINT32, [64])])
    feeds = extreme_inputs(m, {"f": [64], "i": [64]}, seed=1)
    f = feeds["f"].astype(np.float64)
    assert np.isnan(f).any() and np.isposinf(f).any() and np.isneginf(f).any()
    assert (np.signbit(f) & (f == 0)).any() and ((f != 0) & (np.abs(f) < 2.0**-14)).any()
    assert feeds["i"].max() == 2**32 - 1 and feeds["i"].min() == 0 and (feeds["i"] >= 2**31).any()


class _CollapseAnyChain(GraphPass):
    """Deliberately wrong: collapses every Cast chain, uint32 -> double -> int32 included."""

    name = "collapse_any"

    def rewrite(self, ctx: GraphCtx) -> int:
        n = 0
        for c in ctx.nodes:
            src = ctx.source(c.inputs[0]) if c.alive and c.op == "Cast" and c.inputs else None
            if src is not None and src.op == "Cast" and src.inputs[0] != c.inputs[0]:
                ctx.set_input(c, 0, src.inputs[0])
                n += 1
        return n


def test_out_of_range_integers_are_drawn() -> None:
    """The uint32 -> double -> int32 collapse differs only for inputs >= 2**31: --check now sees it."""
    m = graph_model([h.make_node("Cast", ["x"], ["d"], to=T.DOUBLE), h.make_node("Cast", ["d"], ["y"], to=T.INT32)],
               [("x", T.UINT32, [16])], [("y", T.INT32, [16])])
    bad = fold(m, passes=[_CollapseAnyChain()], validate=False).model
    assert not check_equivalent(m, bad).passed


def _loop_model(body_cast_to: int) -> onnx.ModelProto:
    body = h.make_graph(
        [h.make_node("Cast", ["acc"], ["lo"], to=body_cast_to), h.make_node("Cast", ["lo"], ["acc2"], to=T.FLOAT),
         h.make_node("Add", ["acc2", "x"], ["acc_out"]), h.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("acc", T.FLOAT, [4])],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("acc_out", T.FLOAT, [4])])
    return graph_model([h.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
                  [("x", T.FLOAT, [4]), ("n", T.INT64, [])], [("y", T.FLOAT, [4])])


class _DropCastPairsInBodies(GraphPass):
    name = "drop_in_bodies"

    def rewrite(self, ctx: GraphCtx) -> int:
        n = 0
        for c in ctx.nodes:
            src = ctx.source(c.inputs[0]) if c.alive and c.op == "Cast" and c.inputs else None
            if ctx.graph is not None and ctx.parent is not None and src is not None and src.op == "Cast":
                n += ctx.bypass(c, src.inputs[0], "drop")
        return n


def test_loop_with_empty_condition_runs_its_body() -> None:
    """A wrong fold inside a Loop body (fp16 round trip dropped) is caught: the trip count input is pinned > 0."""
    m = _loop_model(T.FLOAT16)
    bad = fold(m, passes=[_DropCastPairsInBodies()], validate=False).model
    assert not check_equivalent(m, bad).passed
    assert check_equivalent(m, fold(m).model).passed


def test_help_says_what_fold_removes(cli) -> None:
    res = cli("fold", "--help")
    text = " ".join(res.out.split())
    assert res.code == 0 and "nothing else" not in text
    for words in ("Cast and Identity", "ANY ONNX op", "other domains", "are kept", "unread initializers",
                  "per op type"):
        assert words in text, words


@pytest.mark.parametrize("t", [T.INT4, T.UINT4, T.INT2, T.UINT2])
def test_sub_byte_integer_inputs_get_a_verdict(cli, tmp_path: Path, t: int) -> None:
    # ml_dtypes' int4/uint4/int2/uint2 are numpy kind 'V': the value-class feeds crashed (exit 3) on np.finfo
    nodes = [h.make_node("Identity", ["x"], ["a"]), h.make_node("Identity", ["a"], ["y"])]
    m = graph_model(nodes, [("x", t, [64])], [("y", t, [64])], opsets=(("", 25),))
    m.ir_version = 12
    onnx.checker.check_model(m, full_check=True)
    feeds = extreme_inputs(m, {"x": [64]}, seed=3)["x"].astype(np.int64)
    bits = 4 if t in (T.INT4, T.UINT4) else 2
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if t in (T.INT4, T.INT2) else (0, 2**bits - 1)
    assert feeds.min() == lo and feeds.max() == hi
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(m, src)
    res = cli("fold", src, "-o", out, "--check")
    assert res.code == 0, res.err
    assert "bit-identical" in res.out and out.exists()


@pytest.mark.parametrize("overridable", [False, True])
def test_loop_with_a_huge_constant_trip_count_exit_2_promptly(cli, tmp_path: Path, overridable: bool) -> None:
    # onnx.reference runs every iteration in Python: 10**12 of them never finished (the check hung)
    trips = nh.from_array(np.array(10**12, np.int64), "M")
    inputs = [("x", T.FLOAT, [1])] + ([("M", T.INT64, [])] if overridable else [])
    m = graph_model(counting_loop("M"), inputs, [("y", T.FLOAT, [1])], [trips])
    onnx.checker.check_model(m, full_check=True)
    assert_fold_check_refused(cli, tmp_path, m, "could not check this model", "op Loop")


def test_loop_with_a_huge_value_int_constant_trip_count_exit_2_promptly(cli, tmp_path: Path) -> None:
    # a Constant written with value_int (not a value tensor) was not read as the trip count: the check ran 10**12 trips
    nodes = [h.make_node("Constant", [], ["M"], value_int=10**12)] + counting_loop("M")
    m = graph_model(nodes, [("x", T.FLOAT, [1])], [("y", T.FLOAT, [1])])
    onnx.checker.check_model(m, full_check=True)
    assert_fold_check_refused(cli, tmp_path, m, "could not check this model", "op Loop")


def test_loop_whose_trip_count_is_an_input_is_still_checked() -> None:
    m = graph_model(counting_loop("M"), [("x", T.FLOAT, [1]), ("M", T.INT64, [])], [("y", T.FLOAT, [1])])
    res = fold(m)
    assert res.report.removed == {"Identity": 1}
    chk = check_equivalent(m, res.model)
    assert chk.passed and chk.runs >= 4


@pytest.mark.parametrize("kind", ["sequence", "optional"])
def test_non_tensor_graph_input_exit_2_naming_it(cli, tmp_path: Path, kind: str) -> None:
    elem = h.make_tensor_type_proto(T.FLOAT, [2])
    if kind == "sequence":
        tp, nodes = h.make_sequence_type_proto(elem), [h.make_node("SequenceLength", ["s2"], ["y"])]
        out_vi = h.make_tensor_value_info("y", T.INT64, [])
    else:
        tp, nodes = h.make_optional_type_proto(elem), [h.make_node("OptionalHasElement", ["s2"], ["y"])]
        out_vi = h.make_tensor_value_info("y", T.BOOL, [])
    g = h.make_graph([h.make_node("Identity", ["s"], ["s2"]), *nodes], "g", [h.make_value_info("s", tp)], [out_vi])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    onnx.checker.check_model(m, full_check=True)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(m, src)
    res = cli("fold", src, "-o", out, "--check")
    assert_one_line_error(res, 2, "could not check this model", f"graph input 's' is an {kind}"
                          if kind == "optional" else "graph input 's' is a sequence")
    assert not out.exists()


class _FoldInitializerInputs(GraphPass):
    """Deliberately wrong: folds a Cast of a graph input's default initializer as if it were a constant."""

    name = "fold_defaults"

    def rewrite(self, ctx: GraphCtx) -> int:
        n = 0
        for c in ctx.nodes:
            if c.alive and c.op == "Cast" and c.inputs and c.inputs[0] in ctx.initializers and c.to is not None:
                value = nh.to_array(ctx.initializers[c.inputs[0]]).astype(h.tensor_dtype_to_np_dtype(c.to))
                ctx.replace_node(c, h.make_node("Constant", [], c.outputs, value=nh.from_array(value)))
                n += 1
        return n


def test_inputs_with_a_default_initializer_are_fed_other_values() -> None:
    """IR >= 4: an initializer that is also a graph input is only a default; --check now overrides it."""
    w = nh.from_array(np.array([1.5, -2.0, 3.0], np.float32), "w")
    m = graph_model([h.make_node("Cast", ["w"], ["w16"], to=T.FLOAT16), h.make_node("Add", ["x", "w16"], ["y"])],
               [("x", T.FLOAT16, [3]), ("w", T.FLOAT, [3])], [("y", T.FLOAT16, [3])], [w])
    onnx.checker.check_model(m, full_check=True)
    res = fold(m)
    assert check_equivalent(m, res.model).passed and res.report.removed == {}
    bad = fold(m, passes=[_FoldInitializerInputs()], validate=False).model
    assert [n.op_type for n in bad.graph.node] == ["Constant", "Add"]
    assert not check_equivalent(m, bad).passed
