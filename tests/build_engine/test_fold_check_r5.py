"""``fold --check`` on held-out models, round 5: a verdict wherever a runtime runs the model, and the op named
when none does. Each case failed before its fix."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto as T
from onnx import helper as h

from trtforge.build_engine.passes import fold
from trtforge.build_engine.verify.bitwise import check_equivalent
from trtforge_testing import assert_one_line_error, graph_model


def _sequence_at(last: str) -> onnx.ModelProto:
    """y = SequenceAt([x, x], i) passed through ``last`` (Identity, or Neg: a wrong fold of it)."""
    nodes = [h.make_node("SequenceConstruct", ["x", "x"], ["s"]), h.make_node("SequenceAt", ["s", "i"], ["e"]),
             h.make_node(last, ["e"], ["y"])]
    m = graph_model(nodes, [("x", T.FLOAT, [3]), ("i", T.INT64, [])], [("y", T.FLOAT, [3])])
    onnx.checker.check_model(m, full_check=True)
    return m


def test_a_typical_draw_the_original_rejects_is_skipped_not_the_verdict() -> None:
    # seed 0: the first draw's position is in range, the second typical draw's is not (the planner's integers lie in
    # [0, 7], the sequence holds 2): 'could not check this model: onnx.reference fails on typical inputs', exit 2,
    # though onnx.reference runs the model
    res = check_equivalent(_sequence_at("Identity"), _sequence_at("Identity"), seed=0)
    assert res.passed and res.runtime == "onnx.reference" and res.runs >= 1
    assert not check_equivalent(_sequence_at("Identity"), _sequence_at("Neg"), seed=0).passed


def test_the_op_is_named_when_the_runtime_message_does_not(cli, tmp_path: Path) -> None:
    # seed 1: no runtime runs the first draw; onnx.reference's 'list index out of range' named no op ('op unknown').
    # The sequence is a SplitToSequence (length 3, not known to the planner: a SequenceConstruct's length bounds the
    # position, test_fold_check_sequence_positions)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    nodes = [h.make_node("SplitToSequence", ["x"], ["s"], axis=0, keepdims=0),
             h.make_node("SequenceAt", ["s", "i"], ["e"]), h.make_node("Identity", ["e"], ["y"])]
    m = graph_model(nodes, [("x", T.FLOAT, [3]), ("i", T.INT64, [])], [("y", T.FLOAT, [])])
    onnx.checker.check_model(m, full_check=True)
    onnx.save_model(m, src)
    res = cli("fold", src, "-o", out, "--check", "--seed", "1")
    assert_one_line_error(res, 2, "could not check this model", "list index out of range; op SequenceAt")
    assert "op unknown" not in res.err and not out.exists()


def test_a_loop_input_named_like_an_outer_value_is_judged_as_the_spec_says() -> None:
    # the Loop's carried input v has the name of the outer (dead) v = Neg(x), which fold removes; onnx.reference gave
    # the body the outer v in the first iteration (-2x, onnxruntime 2x), so --check said OUTPUTS DIFFER on a right fold
    body = h.make_graph([h.make_node("Identity", ["c"], ["c2"]), h.make_node("Add", ["v", "v"], ["v2"])], "body",
                        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
                         h.make_tensor_value_info("v", T.FLOAT, [2])],
                        [h.make_tensor_value_info("c2", T.BOOL, []), h.make_tensor_value_info("v2", T.FLOAT, [2])])
    nodes = [h.make_node("Neg", ["x"], ["v"]), h.make_node("Loop", ["n", "", "x"], ["y"], body=body)]
    m = graph_model(nodes, [("x", T.FLOAT, [2]), ("n", T.INT64, [])], [("y", T.FLOAT, [2])])
    onnx.checker.check_model(m, full_check=True)
    folded = fold(m).model
    assert [n.op_type for n in folded.graph.node] == ["Loop"]
    res = check_equivalent(m, folded)
    assert res.passed and res.runtime == "onnx.reference", res
    wrong = onnx.ModelProto()
    wrong.CopyFrom(folded)
    wrong.graph.node[0].attribute[0].g.node[1].op_type = "Sub"  # v - v: a wrong fold is still seen
    assert not check_equivalent(m, wrong).passed
