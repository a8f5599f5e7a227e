"""Held-out fold cases, round 5: element types of the newest opsets. Each case changed an output bit before."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from trtforge.build_engine.passes import fold
from trtforge_testing import seeded_rng


def _e8m0_same_type_cast() -> onnx.ModelProto:
    """``y = float(Cast(x, to=float8e8m0))`` with ``x`` already float8e8m0 (opset 24 brings the type)."""
    nodes = [h.make_node("Cast", ["x"], ["a"], to=T.FLOAT8E8M0), h.make_node("Cast", ["a"], ["y"], to=T.FLOAT)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT8E8M0, [256])],
                     [h.make_tensor_value_info("y", T.FLOAT, [256])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 24)])
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return m


def test_a_float8e8m0_cast_to_its_own_type_stays() -> None:
    # same_type_cast removed it; onnx.reference's Cast to float8e8m0 rounds 2**-127 up to 2**-126, so every
    # output read through it changed (fold --check: OUTPUTS DIFFER on the fold's own result)
    m = _e8m0_same_type_cast()
    folded = fold(m).model
    assert [n.op_type for n in folded.graph.node] == ["Cast", "Cast"]
    x = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)  # every value of the type
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got = ReferenceEvaluator(folded).run(None, {"x": x})[0]
    assert want.tobytes() == got.tobytes()


def test_fold_check_of_a_float8e8m0_cast_passes(cli, tmp_path: Path) -> None:
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(_e8m0_same_type_cast(), src)
    res = cli("fold", src, "-o", out, "--check")
    assert res.code == 0 and "bit-identical" in res.out, (res.code, res.out, res.err)
    assert out.exists()


def _runs(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[bytes]:
    """Every output's bytes in onnx.reference and in onnxruntime (graph optimizations off)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [np.asarray(o).tobytes() for o in (*ReferenceEvaluator(m).run(None, feeds), *session.run(None, feeds))]


def _assert_exact_on_both_branches(g: onnx.GraphProto, draw: dict[str, tuple[int, type]]) -> None:
    """``g`` (an If on input ``c``) is valid, and its fold gives the same bytes in both runtimes for either branch,
    on fresh random values of each input in ``draw`` (name -> (length, dtype))."""
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(m, full_check=True)
    folded = fold(m).model
    rng = seeded_rng(f"heldout-r5-{g.name}-{sorted(draw)}")
    for c in (True, False):
        feeds: dict[str, np.ndarray] = {"c": np.array(c)}
        for name, (n, dtype) in draw.items():
            feeds[name] = (rng.uniform(-100, 100, n) if dtype is np.float32
                           else rng.integers(-1000, 1000, n)).astype(dtype)
        assert _runs(folded, feeds) == _runs(m, feeds)


@pytest.mark.parametrize("outer", ["read by both branches", "through an Identity", "read by no other node"])
def test_a_branch_initializer_named_like_an_outer_value_is_not_its_value(outer: str) -> None:
    # the then-branch's initializer w = [10, 20] has the name of the outer w = int(x); both runtimes read the outer
    # w in the branch. constant_cast folded the branch's Cast(w) from the initializer, the Identity's removal renamed
    # the outer w away, and dead-node removal dropped an outer w only that branch reads: y became [10, 20]
    casts = [h.make_node("Cast", ["w"], ["wd"], to=T.DOUBLE), h.make_node("Cast", ["wd"], ["t"], to=T.FLOAT)]
    then = h.make_graph(casts, "then", [], [h.make_tensor_value_info("t", T.FLOAT, [2])],
                        initializer=[nh.from_array(np.array([10, 20], np.int32), "w")])
    other = h.make_graph([h.make_node("Cast", ["w"] if outer != "read by no other node" else ["x"], ["e"],
                                      to=T.FLOAT)], "else", [], [h.make_tensor_value_info("e", T.FLOAT, [2])])
    pre = ([h.make_node("Cast", ["x"], ["w0"], to=T.INT32), h.make_node("Identity", ["w0"], ["w"])]
           if outer == "through an Identity" else [h.make_node("Cast", ["x"], ["w"], to=T.INT32)])
    g = h.make_graph([*pre, h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [2]), h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])])
    _assert_exact_on_both_branches(g, {"x": (2, np.float32)})


def test_no_read_is_made_across_a_branch_initializer_named_like_an_outer_value() -> None:
    # the else-branch holds an initializer named like the graph input xi; cast_chain made its Cast(int64(xi)) read xi
    # itself, and onnxruntime then read the branch's initializer there ([7, 0, 300, 1], onnx.reference the input)
    branch_xi = nh.from_array(np.array([7, 0, 300, 1], np.int32), "xi")
    other = h.make_graph([h.make_node("Cast", ["wide"], ["e"], to=T.DOUBLE)], "else", [],
                         [h.make_tensor_value_info("e", T.DOUBLE, [4])], initializer=[branch_xi])
    then = h.make_graph([h.make_node("Constant", [], ["t"], value=nh.from_array(np.zeros(4), "t"))], "then", [],
                        [h.make_tensor_value_info("t", T.DOUBLE, [4])])
    g = h.make_graph([h.make_node("Cast", ["xi"], ["wide"], to=T.INT64),
                      h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                     [h.make_tensor_value_info("xi", T.INT32, [4]), h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.DOUBLE, [4])])
    _assert_exact_on_both_branches(g, {"xi": (4, np.int32)})


def test_a_dead_read_of_a_value_a_sibling_branch_shadows_stays() -> None:
    # onnxruntime reads the outer w in the then-branch (beside its initializer w) only while some branch reads w:
    # the else-branch's dead Neg(w) was removed, and y became the initializer's [10, 20] in onnxruntime
    then = h.make_graph([h.make_node("Identity", ["w"], ["t"])], "then", [],
                        [h.make_tensor_value_info("t", T.FLOAT, [2])],
                        initializer=[nh.from_array(np.array([10, 20], np.float32), "w")])
    other = h.make_graph([h.make_node("Neg", ["w"], ["d"]), h.make_node("Identity", ["x"], ["e"])], "else", [],
                         [h.make_tensor_value_info("e", T.FLOAT, [2])])
    g = h.make_graph([h.make_node("Neg", ["x"], ["w"]),
                      h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [2]), h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])])
    _assert_exact_on_both_branches(g, {"x": (2, np.float32)})
