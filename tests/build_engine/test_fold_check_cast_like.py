"""``fold --check`` on models whose inputs reach an index, a trip count or a condition through a CastLike (what
torch's dynamo exporter leaves): the planner and the control-flow pins follow a CastLike's first input as they follow
a Cast's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.verify.bitwise import check_equivalent
from trtforge.build_engine.verify.fold_feeds import control_pins
from trtforge_testing import graph_model


def _assert_checked_bit_identical(cli, tmp_path: Path, m: onnx.ModelProto) -> None:
    """A valid ``m`` (full check) that ``fold --check`` folds and proves bit-identical (exit 0, output written)."""
    onnx.checker.check_model(m, full_check=True)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(m, src)
    res = cli("fold", src, "-o", out, "--check")
    assert res.code == 0, res.err
    assert "bit-identical" in res.out and out.exists()


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
def test_gather_indices_behind_a_cast_like_are_drawn_in_range(cli, tmp_path: Path, op: str) -> None:
    # the planner followed Cast but not CastLike to the Gather: ids in [0, 7] indexed a table of 3 rows, so neither
    # runtime ran the input ("index 6 is out of bounds") and fold --check refused the model (exit 2)
    widen = (h.make_node("CastLike", ["idx", "i64"], ["j"]) if op == "CastLike"
             else h.make_node("Cast", ["idx"], ["j"], to=T.INT64))
    nodes = [widen, h.make_node("Gather", ["data", "j"], ["g"]), h.make_node("Cast", ["g"], ["g64"], to=T.DOUBLE),
             h.make_node("Cast", ["g64"], ["y"], to=T.FLOAT)]
    m = graph_model(nodes, [("data", T.FLOAT, [3, 5]), ("idx", T.INT32, [6])], [("y", T.FLOAT, [6, 5])],
                    [nh.from_array(np.array(0, np.int64), "i64")], opsets=(("", 21),))
    _assert_checked_bit_identical(cli, tmp_path, m)


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
def test_ids_index_a_table_behind_a_cast_in_range(cli, tmp_path: Path, op: str) -> None:
    # the planner read a Gather's table shape off an initializer, Constant or graph input only: a float16 table
    # widened by a Cast (or a CastLike to the activations' type) before the Gather had no known rows, the ids were
    # drawn in [0, 7] for a table of 3 rows, and fold --check refused the model (exit 2, 'index 3 is out of bounds')
    table = nh.from_array(np.arange(15, dtype=np.float16).reshape(3, 5), "table")
    widen = (h.make_node("CastLike", ["table", "x"], ["wide"]) if op == "CastLike"
             else h.make_node("Cast", ["table"], ["wide"], to=T.FLOAT))
    nodes = [widen, h.make_node("Identity", ["wide"], ["rows"]), h.make_node("Gather", ["rows", "ids"], ["g"]),
             h.make_node("Add", ["g", "x"], ["y"])]
    m = graph_model(nodes, [("x", T.FLOAT, [6, 5]), ("ids", T.INT64, [6])], [("y", T.FLOAT, [6, 5])], [table],
                    opsets=(("", 21),))
    _assert_checked_bit_identical(cli, tmp_path, m)


def _cast_like_loop(mid: int) -> onnx.ModelProto:
    """``y = Loop(CastLike(n, int64), "", x)`` whose body is ``v -> float(Cast(v, mid))``; ``If(CastLike(f, bool))``
    picks between it and ``x``. ``n`` and ``f`` are float graph inputs."""
    vi = h.make_tensor_value_info
    body = h.make_graph([h.make_node("Cast", ["v"], ["vm"], to=mid), h.make_node("Cast", ["vm"], ["vn"], to=T.FLOAT),
                         h.make_node("Identity", ["c"], ["c2"])], "body",
                        [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("v", T.FLOAT, [8])],
                        [vi("c2", T.BOOL, []), vi("vn", T.FLOAT, [8])])
    then = h.make_graph([h.make_node("Loop", ["m", "", "x"], ["lv"], body=body)], "then", [], [vi("lv", T.FLOAT, [8])])
    other = h.make_graph([h.make_node("Identity", ["x"], ["e"])], "else", [], [vi("e", T.FLOAT, [8])])
    nodes = [h.make_node("CastLike", ["n", "i64"], ["m"]), h.make_node("CastLike", ["f", "yes"], ["b"]),
             h.make_node("If", ["b"], ["y"], then_branch=then, else_branch=other)]
    m = graph_model(nodes, [("x", T.FLOAT, [8]), ("n", T.FLOAT, []), ("f", T.FLOAT, [])], [("y", T.FLOAT, [8])],
                    [nh.from_array(np.array(0, np.int64), "i64"), nh.from_array(np.array(True), "yes")],
                    opsets=(("", 21),))
    onnx.checker.check_model(m, full_check=True)
    return m


def test_a_trip_count_and_a_condition_behind_a_cast_like_are_pinned() -> None:
    # the pins followed Cast but not CastLike: control_pins found neither input, so the trip count CastLike(n) was not
    # pinned to 3 and the If on CastLike(f) was not run both ways in each draw (its else branch ran only in the draws
    # where f's value classes hit +-0); the check must still tell a float16 round trip in the body from a double one
    exact, lossy = _cast_like_loop(T.DOUBLE), _cast_like_loop(T.FLOAT16)
    assert control_pins(exact) == ({"n": 3}, ["f"])
    for seed in range(3):
        assert not check_equivalent(exact, lossy, seed=seed).passed, seed
    assert check_equivalent(exact, exact, seed=0).passed
