"""fold() of a model read without its external data: a Constant whose value is still on disk is not a constant here
(its bytes are not in memory), wherever the Constant is (main graph, If branch, model-local function)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from trtforge.build_engine.passes import fold
from trtforge_testing import seeded_rng

_N = 512  # float16 values: 1 KiB, so onnx's save puts the Constant's value in the data file


def _nodes(rng: np.random.Generator, out: str) -> list[onnx.NodeProto]:
    """``out = x + float(CastLike(k, x))`` with ``k`` a float16 Constant (its Cast is exact, so it folds)."""
    k = nh.from_array(rng.uniform(-100, 100, _N).astype(np.float16), "k_value")
    return [h.make_node("Constant", [], ["k"], value=k), h.make_node("CastLike", ["k", "x"], ["kf"]),
            h.make_node("Add", ["x", "kf"], [out])]


def _model(where: str, rng: np.random.Generator) -> onnx.ModelProto:
    vi = h.make_tensor_value_info
    opsets, functions = [h.make_opsetid("", 21)], []
    if where == "main":
        nodes = _nodes(rng, "y")
    elif where == "branch":
        then = h.make_graph(_nodes(rng, "t"), "then", [], [vi("t", T.FLOAT, [_N])])
        other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", T.FLOAT, [_N])])
        nodes = [h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    else:  # the function's CastLike target is its own Cast, so its type is known there
        body = [h.make_node("Cast", ["a"], ["x"], to=T.FLOAT), *_nodes(rng, "b")]
        functions = [h.make_function("local", "F", ["a"], ["b"], body, [h.make_opsetid("", 21)])]
        opsets.append(h.make_opsetid("local", 1))
        nodes = [h.make_node("F", ["x"], ["y"], domain="local")]
    inputs = [vi("x", T.FLOAT, [_N])] + ([vi("c", T.BOOL, [])] if where == "branch" else [])
    g = h.make_graph(nodes, "g", inputs, [vi("y", T.FLOAT, [_N])])
    m = h.make_model(g, opset_imports=opsets, functions=functions)
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("where", ["main", "branch", "function"])
def test_a_constant_still_on_disk_is_not_folded_from_the_working_folder(tmp_path: Path, where: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # constant_tensor skipped an initializer still on disk but not a Constant's value: constant_cast read it with
    # numpy_helper.to_array, which opens the location relative to the working folder, so a file of that name
    # there (another model's data) became the folded constant and every output changed
    rng = seeded_rng(f"external-constant-{where}")
    m = _model(where, rng)
    src = tmp_path / "model" / "m.onnx"
    src.parent.mkdir()
    copy = onnx.ModelProto()
    copy.CopyFrom(m)
    onnx.save_model(copy, src, save_as_external_data=True, location="w.data", size_threshold=1024,
                    convert_attribute=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "w.data").write_bytes(rng.integers(0, 256, 4 * _N, dtype=np.uint8).tobytes())
    monkeypatch.chdir(elsewhere)
    lazy = onnx.load(src, load_external_data=False)
    folded = fold(lazy).model
    onnx.external_data_helper.load_external_data_for_model(folded, str(src.parent))
    x = rng.uniform(-10, 10, _N).astype(np.float32)
    for c in ((True, False) if where == "branch" else (None,)):
        feeds = {"x": x} if c is None else {"x": x, "c": np.array(c)}
        want = ReferenceEvaluator(m).run(None, feeds)[0]
        got = ReferenceEvaluator(folded).run(None, feeds)[0]
        assert want.tobytes() == got.tobytes(), c
