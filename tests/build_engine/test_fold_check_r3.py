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
from trtforge_testing import assert_fold_check_refused, graph_model


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
