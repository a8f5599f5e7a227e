"""``fold --check`` draws a sequence position (SequenceAt, SequenceErase, SequenceInsert) inside the valid range of a
SequenceConstruct's length, so no seed makes both runtimes fail on the first draw. Failed before its fix (exit 2,
'could not check this model', for seed 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from trtforge_testing import graph_model


def _model(op: str) -> onnx.ModelProto:
    s = [h.make_node("SequenceConstruct", ["x", "x"], ["s"])]
    if op == "SequenceAt":
        body = [h.make_node("SequenceAt", ["s", "i"], ["e"])]
    elif op == "SequenceErase":
        body = [h.make_node("SequenceErase", ["s", "i"], ["r"]),
                h.make_node("ConcatFromSequence", ["r"], ["e"], axis=0)]
    else:
        body = [h.make_node("SequenceInsert", ["s", "x", "i"], ["r"]),
                h.make_node("ConcatFromSequence", ["r"], ["e"], axis=0)]
    m = graph_model([*s, *body, h.make_node("Identity", ["e"], ["y"])], [("x", T.FLOAT, [3]), ("i", T.INT64, [])],
                    [("y", T.FLOAT, [9 if op == "SequenceInsert" else 3])])
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("op", ["SequenceAt", "SequenceErase", "SequenceInsert"])
def test_a_sequence_position_is_drawn_in_range(cli: Any, tmp_path: Path, op: str) -> None:
    onnx.save_model(_model(op), tmp_path / "m.onnx")
    for seed in (0, 1, 2, 3):
        res = cli("fold", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--check", "--seed", str(seed))
        assert res.code == 0, (seed, res.err)
        assert "bit-identical" in res.out
