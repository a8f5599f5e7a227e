"""``fold --check`` on held-out models, round 7: a GatherElements whose indices are a graph input gets a verdict.

onnx.reference's GatherElements wraps an out-of-range index one table length at a time in C (``np.choose`` with
``mode="wrap"``): the int64 value class -2**63 made the check loop for ever, deaf to SIGINT and SIGTERM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from trtforge.build_engine.verify.inputs import plan_feeds
from trtforge_testing import graph_model, run_console, seeded_rng


def _gather_elements_model(in_function: bool) -> onnx.ModelProto:
    """y = GatherElements(Cast(Cast(Cast(x, float), double), float), idx, axis=1): the round trip folds; idx is an
    int64 input of shape [2, 3] into a [2, 2] table in the main graph, or into a [2, 8] table in a model-local
    function's body (the planner bounds indices it sees in the main graph; [0, 7] is in range there)."""
    body = [h.make_node("Cast", ["x"], ["x0"], to=T.FLOAT),  # a function's input has no type; its Cast's has
            h.make_node("Cast", ["x0"], ["xd"], to=T.DOUBLE), h.make_node("Cast", ["xd"], ["xf"], to=T.FLOAT),
            h.make_node("GatherElements", ["xf", "idx"], ["y"], axis=1)]
    ins, outs = [("x", T.FLOAT, [2, 8 if in_function else 2]), ("idx", T.INT64, [2, 3])], [("y", T.FLOAT, [2, 3])]
    if not in_function:
        m = graph_model(body, ins, outs)
    else:
        fn = h.make_function("local", "Pick", ["x", "idx"], ["y"], body, [h.make_opsetid("", 17)])
        m = graph_model([h.make_node("Pick", ["x", "idx"], ["y"], domain="local")], ins, outs,
                        opsets=(("", 17), ("local", 1)))
        m.functions.append(fn)
    onnx.checker.check_model(m, full_check=True)
    return m


def test_gather_elements_indices_from_an_input_get_a_verdict(tmp_path: Path) -> None:
    # the value-class draw fed idx = -2**63: onnx.reference looped 2**62 times (the run never ended; the subprocess
    # is killed at the timeout, so the old code fails here instead of hanging the suite)
    for in_function in (False, True):
        src, out = tmp_path / f"in_{in_function}.onnx", tmp_path / f"out_{in_function}.onnx"
        onnx.save_model(_gather_elements_model(in_function), src)
        res = run_console(["fold", str(src), "-o", str(out), "--check"], timeout=90)
        assert res.code == 0, res.err
        assert "bit-identical" in res.out and "onnx.reference" in res.out and out.exists()
        folded = onnx.load(str(out))
        nodes = [n for f in folded.functions for n in f.node] if in_function else list(folded.graph.node)
        assert [n.op_type for n in nodes] == ["Cast"] * in_function + ["GatherElements"]  # the round trip went
        rng = seeded_rng("gather-elements-r7")
        width = 8 if in_function else 2
        feeds = {"x": rng.standard_normal((2, width)).astype(np.float32), "idx": rng.integers(-width, width, (2, 3))}
        want = ReferenceEvaluator(_gather_elements_model(in_function)).run(None, feeds)[0]
        got = ReferenceEvaluator(folded).run(None, feeds)[0]
        assert want.tobytes() == got.tobytes()


def test_gather_elements_indices_are_planned_in_range() -> None:
    # typical draws of idx lay in [0, 7] on a table of 2: every one out of range (onnx.reference wrapped them,
    # onnxruntime refuses them)
    (_x, idx) = plan_feeds(_gather_elements_model(False))
    assert (idx.name, idx.low, idx.high) == ("idx", 0, 1)


def test_an_integer_size_input_is_never_drawn_zero(tmp_path: Path) -> None:
    # STFT's frame_step and frame_length are graph inputs (onnx's own test_stft): the typical draw gave frame_step 0,
    # onnx.reference refused it, and onnxruntime, the fallback judge, divided by it: SIGFPE, the check process died
    nodes = [h.make_node("STFT", ["x", "step", "", "length"], ["s"]), h.make_node("Cast", ["s"], ["sd"], to=T.DOUBLE),
             h.make_node("Cast", ["sd"], ["y"], to=T.FLOAT)]
    m = graph_model(nodes, [("x", T.FLOAT, [1, 128, 1]), ("step", T.INT64, []), ("length", T.INT64, [])],
                    [("y", T.FLOAT, ["B", "F", "K", 2])])
    onnx.checker.check_model(m, full_check=True)
    src, out = tmp_path / "stft.onnx", tmp_path / "stft_out.onnx"
    onnx.save_model(m, src)
    res = run_console(["fold", str(src), "-o", str(out), "--check"], timeout=90)
    assert res.code == 0, (res.code, res.err)
    assert "bit-identical" in res.out and out.exists()
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["STFT"]  # the round trip went
