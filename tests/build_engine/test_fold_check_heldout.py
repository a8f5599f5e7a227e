"""``fold --check`` on held-out models: narrow float inputs, Loops nested in branches and functions (bodies run, trip
counts pinned, constant trip counts found where they resolve), sequence / map / complex outputs, inputs too big to
draw, inputs that size a tensor. Each case was a wrong verdict, a hang, an internal error or gigabytes before."""

from __future__ import annotations

import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.passes import fold
from trtforge.build_engine.verify.bitwise import MAX_LOOP_TRIPS, _trials, check_equivalent, run_model
from trtforge.build_engine.verify.compare import compare_arrays
from trtforge.build_engine.verify.fold_feeds import control_pins, extreme_inputs, sizing_inputs
from trtforge_testing import assert_fold_check_refused, assert_one_line_error, counting_loop, graph_model


@pytest.mark.parametrize("t", [T.FLOAT8E5M2, T.FLOAT8E4M3FN, T.FLOAT8E5M2FNUZ, T.FLOAT8E8M0, T.FLOAT4E2M1])
def test_narrow_float_inputs_get_a_verdict(cli, tmp_path: Path, t: int) -> None:
    # ml_dtypes' float8_e5m2 is numpy kind 'f', yet np.finfo rejects it: --check crashed (exit 3) on such an input
    nodes = [h.make_node("Cast", ["x"], ["a"], to=T.FLOAT), h.make_node("Cast", ["a"], ["y"], to=t)]
    m = graph_model(nodes, [("x", t, [64])], [("y", t, [64])], opsets=(("", 25),))
    m.ir_version = 12
    onnx.checker.check_model(m, full_check=True)
    f = extreme_inputs(m, {"x": [64]}, seed=3)["x"].astype(np.float64)
    assert float(ml_dtypes.finfo(h.tensor_dtype_to_np_dtype(t)).max) in f  # the extremes are drawn
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(m, src)
    res = cli("fold", src, "-o", out, "--check")
    assert res.code == 0, res.err
    assert "bit-identical" in res.out and out.exists()


@pytest.mark.parametrize("where", ["branch", "function", "function argument"])
def test_a_huge_constant_trip_count_out_of_sight_exit_2_promptly(cli, tmp_path: Path, where: str) -> None:
    # only a Loop's own graph was searched for its constant trip count: one counting to a main-graph constant from
    # inside an If, or to a constant in (or passed to) a model-local function, ran 10**12 iterations
    big = h.make_node("Constant", [], ["M"], value=nh.from_array(np.array(10**12, np.int64)))
    loop = counting_loop("M")
    vi = h.make_tensor_value_info
    functions = []
    if where == "branch":
        then = h.make_graph(loop, "then", [], [vi("y", T.FLOAT, [1])])
        other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", T.FLOAT, [1])])
        nodes = [big, h.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)]
    else:
        body = loop if where == "function" else loop[1:]
        fn = h.make_function("local", "L", ["x", "M"] if where != "function" else ["x"], ["y"],
                             [big, *body] if where == "function" else [h.make_node("Identity", ["x"], ["xi"]), *body],
                             [h.make_opsetid("", 17)])
        functions = [fn]
        nodes = ([big] if where != "function" else []) + [
            h.make_node("L", ["x", "M"] if where != "function" else ["x"], ["out"], domain="local")]
    g = h.make_graph(nodes, "g", [vi("x", T.FLOAT, [1]), vi("c", T.BOOL, [])], [vi("out", T.FLOAT, [1])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("local", 1)], functions=functions)
    onnx.checker.check_model(m, full_check=True)
    assert_fold_check_refused(cli, tmp_path, m, "could not check this model", "op Loop")


def test_an_input_too_big_to_draw_exit_2_naming_it(cli, tmp_path: Path) -> None:
    # a static [60000, 60000] input: drawing its feeds raised MemoryError ("internal error", exit 3)
    m = graph_model([h.make_node("Identity", ["x"], ["a"]), h.make_node("Relu", ["a"], ["y"])],
               [("x", T.FLOAT, [60000, 60000])], [("y", T.FLOAT, [60000, 60000])])
    onnx.checker.check_model(m, full_check=True)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(m, src)
    res = cli("fold", src, "-o", out, "--check")
    assert_one_line_error(res, 2, "could not check this model", "graph input 'x'", "3600000000 elements")
    assert not out.exists()


def _loop_in_a_branch(mid: int) -> onnx.ModelProto:
    """If(c0) then Loop(n, cc) over v -> Cast(Cast(v + 0, mid), float), else -x: the trip count and the condition are
    main-graph inputs read (captured) only inside the branch."""
    vi = h.make_tensor_value_info
    body = _round_trip_body(mid, np.zeros(4, np.float32))
    then = h.make_graph([h.make_node("Loop", ["n", "cc", "x"], ["lv"], body=body)], "then", [],
                        [vi("lv", T.FLOAT, [4])])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", T.FLOAT, [4])])
    m = graph_model([h.make_node("If", ["c0"], ["y"], then_branch=then, else_branch=other)],
               [("x", T.FLOAT, [4]), ("c0", T.BOOL, []), ("n", T.INT64, []), ("cc", T.BOOL, [])],
               [("y", T.FLOAT, [4])])
    onnx.checker.check_model(m, full_check=True)
    return m


def test_a_loop_nested_in_a_branch_runs_its_body_and_the_check_ends() -> None:
    # the trip count and condition of a Loop inside an If were not pinned: value-class draws gave it 2**63 - 1 trips
    # (seeds 4 and 5 never finished) or none (seed 0 passed a body that rounds through fp16)
    exact, lossy = _loop_in_a_branch(T.DOUBLE), _loop_in_a_branch(T.FLOAT16)
    assert control_pins(exact) == ({"n": 3, "cc": True}, ["c0"])
    for seed in range(6):
        assert not check_equivalent(exact, lossy, seed=seed).passed, seed
    folded = fold(exact)
    assert folded.report.removed == {"Cast": 2}
    chk = check_equivalent(exact, folded.model, seed=4)
    assert chk.passed and chk.runs >= 4


def _round_trip_body(mid: int, addend: np.ndarray) -> onnx.GraphProto:
    """A Loop body over v (float, ``addend``'s shape): v -> Cast(Cast(v + addend, mid), float); the condition passes
    through."""
    vi = h.make_tensor_value_info
    shape = list(addend.shape)
    return h.make_graph([h.make_node("Add", ["v", "k"], ["w"]), h.make_node("Cast", ["w"], ["wm"], to=mid),
                         h.make_node("Cast", ["wm"], ["vn"], to=T.FLOAT), h.make_node("Identity", ["c"], ["c2"])],
                        "body", [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("v", T.FLOAT, shape)],
                        [vi("c2", T.BOOL, []), vi("vn", T.FLOAT, shape)], initializer=[nh.from_array(addend, "k")])


def _loop_in_a_function(mid: int, trips: str) -> onnx.ModelProto:
    """local.L(trips, x): a Loop without a condition input over v -> Cast(Cast(v + 0, mid), float)."""
    vi = h.make_tensor_value_info
    body = _round_trip_body(mid, np.zeros(4, np.float32))
    fn = h.make_function("local", "L", ["m", "a"], ["o"], [h.make_node("Loop", ["m", "", "a"], ["o"], body=body)],
                         [h.make_opsetid("", 21)])
    nodes = [h.make_node("Constant", [], ["three"], value=nh.from_array(np.array(3, np.int64))),
             h.make_node("L", [trips, "x"], ["y"], domain="local")]
    g = h.make_graph(nodes, "g", [vi("x", T.FLOAT, [4]), vi("n", T.INT64, [])], [vi("y", T.FLOAT, [4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("local", 1)], functions=[fn])
    onnx.checker.check_model(m, full_check=True)
    return m


def test_a_loop_in_a_function_runs_its_body_and_the_check_ends() -> None:
    # onnx.reference runs no iteration of a Loop without a condition input; only the graphs' Loops got an explicit
    # true, so a function's body was never run (an fp16 round trip in it passed); once run, its trip count (a graph
    # input) was not pinned: 7043612502709639116 trips for seed 9
    for trips in ("three", "n"):
        exact, lossy = _loop_in_a_function(T.DOUBLE, trips), _loop_in_a_function(T.FLOAT16, trips)
        assert not check_equivalent(exact, lossy).passed, trips
    assert control_pins(exact) == ({"n": 3}, [])
    chk = check_equivalent(exact, fold(exact).model, seed=9)
    assert chk.passed and chk.runs >= 4


def _round_trip_into(mid: int, tail: list[onnx.NodeProto], out: onnx.ValueInfoProto, opsets=(("", 17),),
                     shape=(5,)) -> onnx.ModelProto:
    nodes = [h.make_node("Cast", ["x"], ["xm"], to=mid), h.make_node("Cast", ["xm"], ["xf"], to=T.FLOAT), *tail]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, list(shape))], [out],
                     initializer=[nh.from_array(np.array([2, 3], np.int64), "split")])
    m = h.make_model(g, opset_imports=[h.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def test_sequence_and_map_outputs_get_the_right_verdict(cli, tmp_path: Path) -> None:
    # a sequence of tensors of two shapes was made one array: "could not check this model" although both runtimes
    # run it; a sequence of maps became an object array whose NaN values never equal: "OUTPUTS DIFFER" (exit 1)
    ragged = ([h.make_node("SplitToSequence", ["xf", "split"], ["y"])],
              h.make_tensor_sequence_value_info("y", T.FLOAT, ["k"]), (("", 17),), (5,))
    maps = ([h.make_node("ZipMap", ["xf"], ["y"], domain="ai.onnx.ml", classlabels_int64s=[1, 2, 3])],
            h.make_value_info("y", h.make_sequence_type_proto(
                h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, [])))),
            (("", 17), ("ai.onnx.ml", 3)), (2, 3))
    for k, case in enumerate((ragged, maps)):
        exact, lossy = _round_trip_into(T.DOUBLE, *case), _round_trip_into(T.FLOAT16, *case)
        folded = fold(exact)
        assert folded.report.removed == {"Cast": 2}
        assert check_equivalent(exact, folded.model).passed
        assert not check_equivalent(exact, lossy).passed
        src, out = tmp_path / f"in{k}.onnx", tmp_path / f"out{k}.onnx"
        onnx.save_model(exact, src)
        res = cli("fold", src, "-o", out, "--check")
        assert res.code == 0 and res.err == "", res.err
        assert "bit-identical" in res.out and out.exists()


def test_complex_outputs_are_compared_as_complex_numbers() -> None:
    # compared as float64, a change of the imaginary part measured 0 and numpy warned on stderr
    a = np.array([1 + 2j, 3 - 1j], np.complex64)
    b = np.array([1 + 2j, 3 + 1j], np.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = compare_arrays(a, b)
    assert not d.bitwise and d.max_abs_unequal == 2.0 and compare_arrays(a, a.copy()).bitwise


def _loop_counting_to(mid: int, opset: int) -> onnx.ModelProto:
    """Loop(n + 1) over v -> Cast(Cast(v + 1, mid), float): a trip count computed from a graph input."""
    body = _round_trip_body(mid, np.array([1.0], np.float32))
    nodes = [h.make_node("Add", ["n", "k1"], ["M"]), h.make_node("Identity", ["x"], ["xi"]),
             h.make_node("Loop", ["M", "", "xi"], ["y"], body=body)]
    m = graph_model(nodes, [("x", T.FLOAT, [1]), ("n", T.INT64, [])], [("y", T.FLOAT, [1])],
               [nh.from_array(np.array(1, np.int64), "k1")], opsets=(("", opset),))
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("opset", [11, 17])  # Less + Where below opset 12, Min from 12
def test_a_trip_count_computed_from_an_input_ends(opset: int) -> None:
    # n + 1 is no graph input to pin: value-class n = 7043612502709639116 (seed 9) made onnx.reference run that many
    # iterations. n now keeps typical values (it decides how long the Loop runs), and were it ever huge, both models
    # run at most MAX_LOOP_TRIPS iterations; a change in the body still shows
    exact, lossy = _loop_counting_to(T.DOUBLE, opset), _loop_counting_to(T.FLOAT16, opset)
    assert sizing_inputs(exact) == {"n"}
    assert all(0 <= int(feeds["n"]) <= 7 for _, feeds in _trials(exact, 9, 2))
    capped = run_model(exact, {"x": np.zeros(1, np.float32), "n": np.array(2**62, np.int64)}, "onnx.reference")
    assert capped[0].tolist() == [float(MAX_LOOP_TRIPS)]
    folded = fold(exact)
    assert folded.report.removed == {"Cast": 2, "Identity": 1}
    chk = check_equivalent(exact, folded.model, seed=9)
    assert chk.passed and chk.runs >= 4
    assert not check_equivalent(exact, lossy, seed=9).passed


def test_inputs_that_size_a_tensor_keep_typical_values() -> None:
    # Cast(Range(0, n)) with the value class n = 1926934702 (seed 0) allocated 7.7 GB of int32 and as much float per
    # run; such inputs (through any op but Shape/Size) now keep their typical values, the others every value class
    nodes = [h.make_node("Add", ["n", "zero"], ["n2"]), h.make_node("Range", ["zero", "n2", "one"], ["r"]),
             h.make_node("Cast", ["r"], ["rf"], to=T.FLOAT), h.make_node("Cast", ["rf"], ["y"], to=T.DOUBLE),
             h.make_node("Cast", ["x"], ["xd"], to=T.DOUBLE), h.make_node("Cast", ["xd"], ["xf"], to=T.FLOAT),
             h.make_node("Neg", ["xf"], ["z"])]
    m = graph_model(nodes, [("n", T.INT32, []), ("x", T.FLOAT, [8])], [("y", T.DOUBLE, ["k"]), ("z", T.FLOAT, [8])],
               [nh.from_array(np.array(0, np.int32), "zero"), nh.from_array(np.array(1, np.int32), "one")])
    onnx.checker.check_model(m, full_check=True)
    assert sizing_inputs(m) == {"n"}
    draws = _trials(m, 0, 2)
    assert all(0 <= int(feeds["n"]) <= 7 for _, feeds in draws)
    assert any(np.isnan(feeds["x"]).any() for _, feeds in draws)
    folded = fold(m)
    assert folded.report.removed == {"Cast": 2}
    chk = check_equivalent(m, folded.model)
    assert chk.passed and chk.runs >= 6


@pytest.mark.parametrize("shape", [[], [8]])
def test_small_inputs_get_every_value_class(shape: list[int]) -> None:
    # an input with fewer elements than value classes got a random few of them per draw: a change on -0.0 alone
    # (x + 0) passed for seeds 0-2 with 8 elements, one on NaN alone for seeds 1-2; now windows of the classes
    # across draws give every input all of them
    def neg_of(nodes: list[onnx.NodeProto], inits=()) -> onnx.ModelProto:
        m = graph_model([*nodes, h.make_node("Neg", ["xx"], ["y"])], [("x", T.FLOAT, shape)], [("y", T.FLOAT, shape)],
                   inits)
        onnx.checker.check_model(m, full_check=True)
        return m

    zero = [nh.from_array(np.array(0, np.float32), "z")]
    exact = neg_of([h.make_node("Identity", ["x"], ["xx"])])
    changed = {"-0.0": neg_of([h.make_node("Add", ["x", "z"], ["xx"])], zero),
               "NaN": neg_of([h.make_node("IsNaN", ["x"], ["n"]), h.make_node("Where", ["n", "z", "x"], ["xx"])],
                             zero),
               "inf": neg_of([h.make_node("Clip", ["x", "lo", "hi"], ["xx"])],
                             [nh.from_array(np.array(-3.4e38, np.float32), "lo"),
                              nh.from_array(np.array(3.4e38, np.float32), "hi")])}
    for seed in range(3):
        assert check_equivalent(exact, fold(exact).model, seed=seed).passed
        for what, m in changed.items():
            assert not check_equivalent(exact, m, seed=seed).passed, (what, seed)
