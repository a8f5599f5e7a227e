"""fold --check on models where a graph input decides an output's size through a float scale or a length: the
value-class draws (1e38, inf) made Resize allocate without bound and the check was killed by the kernel (exit 137).
Such inputs keep typical values (``fold_feeds.sizing_inputs``); the other inputs still get every value class."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from trtforge.build_engine.passes import fold
from trtforge.build_engine.verify.bitwise import _trials, check_equivalent
from trtforge.build_engine.verify.fold_feeds import sizing_inputs
from trtforge_testing import graph_model


def _round_trip(x: str, mid: int) -> list[onnx.NodeProto]:
    return [h.make_node("Cast", [x], ["x_mid"], to=mid), h.make_node("Cast", ["x_mid"], ["x_back"], to=T.FLOAT)]


def _resize(opset: int, mid: int) -> onnx.ModelProto:
    if opset < 10:  # Upsample(X, scales)
        op = h.make_node("Upsample", ["x_back", "scales"], ["y"], mode="nearest")
    else:  # Resize(X, roi, scales)
        op = h.make_node("Resize", ["x_back", "", "scales"], ["y"], mode="nearest")
    return graph_model([*_round_trip("x", mid), op], [("x", T.FLOAT, [1, 1, 2, 3]), ("scales", T.FLOAT, [4])],
                       [("y", T.FLOAT, ["a", "b", "c", "d"])], opsets=(("", opset),))


@pytest.mark.parametrize("opset", [9, 13, 19])
def test_resize_scales_from_an_input_get_a_verdict(opset: int) -> None:
    exact, lossy = _resize(opset, T.DOUBLE), _resize(opset, T.FLOAT16)
    onnx.checker.check_model(exact, full_check=True)
    assert sizing_inputs(exact) == {"scales"}
    draws = _trials(exact, 0, 2)
    assert all(set(f["scales"].tolist()) <= {1.0, 2.0} for _, f in draws)
    assert any(np.isnan(f["x"]).any() for _, f in draws)  # x still gets the special values
    folded = fold(exact)
    assert folded.report.removed == {"Cast": 2}
    chk = check_equivalent(exact, folded.model, seed=3)
    assert chk.passed and chk.runs >= 2
    assert not check_equivalent(exact, lossy, seed=3).passed  # x's draws still reach fp16's lossy values


@pytest.mark.parametrize("op,k,inputs", [
    ("DFT", 1, [("sig", T.FLOAT, [1, 8, 1]), ("n", T.INT64, [])]),
    ("HannWindow", 0, [("n", T.INT64, [])]),
    ("Col2Im", 1, [("sig", T.FLOAT, [1, 4, 4]), ("n", T.INT64, [2]), ("bs", T.INT64, [2])]),
])
def test_lengths_that_size_an_output_are_sizing_inputs(op: str, k: int, inputs: list[tuple[str, int, list]]) -> None:
    names = [i[0] for i in inputs]
    node_inputs = {"DFT": ["sig", "n"], "HannWindow": ["n"], "Col2Im": ["sig", "n", "bs"]}[op]
    assert node_inputs[k] == "n" and set(node_inputs) == set(names)
    m = graph_model([h.make_node(op, node_inputs, ["y"])], inputs, [("y", T.FLOAT, None)], opsets=(("", 20),))
    assert "n" in sizing_inputs(m)
