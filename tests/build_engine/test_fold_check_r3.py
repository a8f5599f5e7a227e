"""``fold --check`` on held-out models, round 3: models that draw random values, and corruptions only a value at a
float's precision edge shows. Each case was a wrong verdict before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.verify.bitwise import check_equivalent
from trtforge_testing import assert_fold_check_refused, assert_one_line_error, graph_model, run_console


@pytest.mark.parametrize("op", ["RandomNormalLike", "Dropout"])
def test_an_unseeded_random_op_is_no_difference_but_no_verdict(cli, tmp_path: Path, op: str) -> None:
    # fold changes nothing here, yet --check said OUTPUTS DIFFER (exit 1): two runs of the original differ already
    inits = [nh.from_array(np.array(0.5, np.float32), "ratio"), nh.from_array(np.array(True), "train")]
    rand = (h.make_node("Dropout", ["x", "ratio", "train"], ["r"]) if op == "Dropout" else
            h.make_node(op, ["x"], ["r"]))
    m = graph_model([rand, h.make_node("Add", ["x", "r"], ["y"])], [("x", T.FLOAT, [4, 8])],
                    [("y", T.FLOAT, [4, 8])], inits=inits if op == "Dropout" else [])
    onnx.checker.check_model(m, full_check=True)
    assert_fold_check_refused(cli, tmp_path, m, "could not check this model", f"op {op}", "seed")


def test_a_seeded_random_op_is_still_judged() -> None:
    # with a seed the original repeats itself: a real difference is still a difference (exit 1)
    def model(round_trip: bool) -> onnx.ModelProto:
        nodes = [h.make_node("RandomNormalLike", ["x"], ["r"], seed=7.0), h.make_node("Add", ["x", "r"], ["s"])]
        nodes += ([h.make_node("Cast", ["s"], ["s16"], to=T.FLOAT16), h.make_node("Cast", ["s16"], ["y"], to=T.FLOAT)]
                  if round_trip else [h.make_node("Identity", ["s"], ["y"])])
        return graph_model(nodes, [("x", T.FLOAT, [4, 8])], [("y", T.FLOAT, [4, 8])])

    assert check_equivalent(model(True), model(True)).passed
    assert not check_equivalent(model(True), model(False)).passed


def _cast_chain(src: int, types: list[int], dst: int, clip: int | None = None, opset: int = 17) -> onnx.ModelProto:
    """x (src) [-> Min/Max to +-clip] -> Cast to each of ``types`` in turn -> y (dst)."""
    nodes, cur, inits = [], "x", []
    if clip is not None:
        inits = [nh.from_array(np.array([clip], np.int32), "hi"), nh.from_array(np.array([-clip], np.int32), "lo")]
        nodes += [h.make_node("Min", ["x", "hi"], ["a"]), h.make_node("Max", ["a", "lo"], ["b"])]
        cur = "b"
    for k, t in enumerate(types):
        nodes.append(h.make_node("Cast", [cur], [f"c{k}"], to=t))
        cur = f"c{k}"
    nodes.append(h.make_node("Identity", [cur], ["y"]))
    m = graph_model(nodes, [("x", src, [6])], [("y", dst, [6])], inits=inits, opsets=(("", opset),))
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_double_rounding_or_a_lost_integer_bit_is_caught(seed: int) -> None:
    # both hand-made corruptions passed --check for every seed: no drawn value was at a precision edge
    # float64 -> float32 -> float16 rounds twice: differs from the one rounding on 1 + 2**-11 + 2**-40 alone
    one, two = _cast_chain(T.DOUBLE, [T.FLOAT16], T.FLOAT16), _cast_chain(T.DOUBLE, [T.FLOAT, T.FLOAT16], T.FLOAT16)
    assert not check_equivalent(one, two, seed=seed).passed
    # int32 clipped to +-2**25 through float32: only the integers past 2**24 float32 cannot hold show it
    same = _cast_chain(T.INT32, [], T.INT32, clip=2**25)
    lossy = _cast_chain(T.INT32, [T.FLOAT, T.INT32], T.INT32, clip=2**25)
    assert not check_equivalent(same, lossy, seed=seed).passed
    assert check_equivalent(lossy, lossy, seed=seed).passed
    # float32 -> float8 through float16 or bfloat16: a second rounding only at a float8 tie + 2**-12
    for f8 in (T.FLOAT8E4M3FN, T.FLOAT8E5M2):
        direct = _cast_chain(T.FLOAT, [f8], f8, opset=21)
        for mid in (T.FLOAT16, T.BFLOAT16):
            assert not check_equivalent(direct, _cast_chain(T.FLOAT, [mid, f8], f8, opset=21), seed=seed).passed


def _round_trip_after(nodes: list, inputs: list, inits: list, out_shape: list) -> onnx.ModelProto:
    """``nodes`` (making m), then an exact round trip m -> double -> y for fold to take."""
    tail = [h.make_node("Cast", ["m"], ["d"], to=T.DOUBLE), h.make_node("Cast", ["d"], ["y"], to=T.FLOAT)]
    ops = (("", 17), ("com.microsoft", 1))
    m = graph_model([*nodes, *tail], inputs, [("y", T.FLOAT, out_shape)], inits=inits, opsets=ops)
    onnx.checker.check_model(m, full_check=True)
    return m


def test_a_dynamic_dim_that_must_broadcast_is_checked_at_1(cli, tmp_path: Path) -> None:
    # x[N] + b[4] runs only for N in {1, 4}; N was drawn 2 and the check said 'onnx.reference cannot run it' (exit 2)
    m = _round_trip_after([h.make_node("Add", ["x", "b"], ["m"])], [("x", T.FLOAT, ["N"])],
                          [nh.from_array(np.arange(4, dtype=np.float32), "b")], [4])
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(m, src)
    res = cli("fold", src, "-o", out, "--check")
    assert res.code == 0, res.err
    assert "bit-identical" in res.out and out.exists()


def test_onnxruntime_kernel_errors_stay_off_stderr(tmp_path: Path) -> None:
    # onnxruntime logged each failing kernel on stderr (fd 2, in a subprocess): three lines before the one 'error:'
    # line of a model no size runs, and five on the stderr of a check that passed (skipped value-class draws)
    no_size = _round_trip_after([h.make_node("MatMul", ["x", "w"], ["m"])], [("x", T.FLOAT, ["N", "K"])],
                                [nh.from_array(np.ones((5, 3), np.float32), "w")], ["N", 3])
    # com.microsoft Gelu: onnx.reference cannot run it, so onnxruntime judges; value-class ids index out of range
    ort_judged = _round_trip_after([h.make_node("Gather", ["tab", "ids"], ["g"]),
                                    h.make_node("Gelu", ["g"], ["m"], domain="com.microsoft")],
                                   [("ids", T.INT64, [6])], [nh.from_array(np.ones((10, 4), np.float32), "tab")],
                                   [6, 4])
    for name, m, code in (("no_size", no_size, 2), ("ort_judged", ort_judged, 0)):
        src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_out.onnx"
        onnx.save_model(m, src)
        res = run_console(["fold", str(src), "-o", str(out), "--check"])
        assert res.code == code, res.err
        if code == 2:
            assert_one_line_error(res, 2, "could not check this model", "on inputs x [2, 4]", "op MatMul")
        else:
            assert res.err == "" and "onnxruntime" in res.out


def test_check_judges_the_model_fold_writes_without_it(cli, tmp_path: Path) -> None:
    # a Cast of an external weight of >= 1 MiB (left on disk, so not folded) was folded under --check only, whose
    # external data is read first: 'fold --check' wrote (and proved) another model than 'fold'
    w = nh.from_array(np.linspace(-3, 3, 1 << 20).astype(np.float16), "w")
    m = graph_model([h.make_node("Cast", ["w"], ["wf"], to=T.FLOAT), h.make_node("Add", ["x", "wf"], ["y"])],
                    [("x", T.FLOAT, [1 << 20])], [("y", T.FLOAT, [1 << 20])], inits=[w])
    src = tmp_path / "m.onnx"
    onnx.save_model(m, src, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    outs = [tmp_path / "plain.onnx", tmp_path / "checked.onnx"]
    for out, extra in zip(outs, ([], ["--check"]), strict=True):
        res = cli("fold", src, "-o", out, *extra)
        assert res.code == 0, res.err
    plain, checked = (onnx.load(str(o), load_external_data=False) for o in outs)
    assert plain.graph.node == checked.graph.node  # the data files differ in name only (below)
    assert [(t.name, t.data_type, list(t.dims)) for t in plain.graph.initializer] == [
        (t.name, t.data_type, list(t.dims)) for t in checked.graph.initializer]
    assert [n.op_type for n in checked.graph.node] == ["Cast", "Add"]
    assert (tmp_path / "plain.onnx.data").read_bytes() == (tmp_path / "checked.onnx.data").read_bytes()


def test_a_loop_bounded_by_its_condition_alone_ends() -> None:
    # while v < 1e30: v = 2 |v| -- never ends for the value classes +-0.0 (the check hung): capped now
    body = h.make_graph([h.make_node("Abs", ["v"], ["a"]), h.make_node("Mul", ["a", "two"], ["v2"]),
                         h.make_node("Less", ["v2", "lim"], ["c2"])],
                        "body", [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, [1]),
                                 h.make_tensor_value_info("v", T.FLOAT, [1])],
                        [h.make_tensor_value_info("c2", T.BOOL, [1]), h.make_tensor_value_info("v2", T.FLOAT, [1])],
                        initializer=[nh.from_array(np.array([2.0], np.float32), "two")])
    lim = nh.from_array(np.array([1e30], np.float32), "lim")

    def model(tail: str) -> onnx.ModelProto:
        nodes = [h.make_node("Less", ["x", "lim"], ["c0"]), h.make_node("Loop", ["", "c0", "x"], ["v"], body=body),
                 h.make_node(tail, ["v"], ["y"])]
        return graph_model(nodes, [("x", T.FLOAT, [1])], [("y", T.FLOAT, [1])], inits=[lim])

    same, changed = model("Identity"), model("Neg")
    onnx.checker.check_model(same, full_check=True)
    result = check_equivalent(same, changed)
    assert not result.passed and result.runs > 2
