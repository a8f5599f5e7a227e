"""Identity, same-type Cast, round trips, chains and dead nodes: each fires, and each refuses its unsafe cases."""

from __future__ import annotations

import pytest
from onnx import TensorProto as T
from onnx import helper as h

F, F16, F64, BF16, I8, I32, I64, B = T.FLOAT, T.FLOAT16, T.DOUBLE, T.BFLOAT16, T.INT8, T.INT32, T.INT64, T.BOOL


def cast(i: str, o: str, to: int):
    return h.make_node("Cast", [i], [o], to=to)


def test_identity_removed_and_output_name_kept(kit, folded) -> None:
    m = kit.make_model([h.make_node("Identity", ["x"], ["a"]), h.make_node("Relu", ["a"], ["b"]),
                        h.make_node("Identity", ["b"], ["y"])], [("x", F, [4])], [("y", F, [4])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Relu"]
    assert out.graph.node[0].output[0] == "y"
    assert rep["removed"] == {"Identity": 2} and rep["rules"]["identity"] == 2
    assert rep["nodes_before"] == 3 and rep["nodes_after"] == 1


def test_identity_between_graph_input_and_output_kept(kit, folded) -> None:
    m = kit.make_model([h.make_node("Identity", ["x"], ["y"])], [("x", F, [4])], [("y", F, [4])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Identity"] and rep["rules"] == {}


def test_two_graph_outputs_same_value_keep_both_names(kit, folded) -> None:
    m = kit.make_model([h.make_node("Relu", ["x"], ["a"]), h.make_node("Identity", ["a"], ["y1"]),
                        h.make_node("Identity", ["a"], ["y2"])], [("x", F, [4])], [("y1", F, [4]), ("y2", F, [4])])
    out, _ = folded(m)
    assert kit.ops(out) == ["Relu", "Identity"]
    produced = {o for n in out.graph.node for o in n.output}
    assert {"y1", "y2"} <= produced


def test_identity_of_graph_output_to_graph_output_kept(kit, folded) -> None:
    m = kit.make_model([h.make_node("Relu", ["x"], ["y1"]), h.make_node("Identity", ["y1"], ["y2"])],
                       [("x", F, [4])], [("y1", F, [4]), ("y2", F, [4])])
    out, _ = folded(m)
    assert kit.ops(out) == ["Relu", "Identity"]


def test_same_type_cast_removed(kit, folded) -> None:
    m = kit.make_model([cast("x", "a", F), h.make_node("Neg", ["a"], ["y"])], [("x", F, [4])], [("y", F, [4])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Neg"] and rep["rules"]["same_type_cast"] == 1


def test_same_type_cast_between_input_and_output_kept(kit, folded) -> None:
    m = kit.make_model([cast("x", "y", F)], [("x", F, [4])], [("y", F, [4])])
    out, _ = folded(m)
    assert kit.ops(out) == ["Cast"]


@pytest.mark.parametrize(("t", "u"), [(F, F64), (F16, F), (BF16, F), (I8, F16), (I32, I64), (I32, F64), (B, F),
                                      (B, I8), (T.UINT8, BF16), (T.INT16, F)])
def test_round_trip_removed_when_embedding(kit, folded, t: int, u: int) -> None:
    m = kit.make_model([cast("x", "a", u), cast("a", "b", t), h.make_node("Concat", ["b", "x"], ["y"], axis=0)],
                       [("x", t, [16])], [("y", t, [32])])
    out, rep = folded(m)
    assert "Cast" not in kit.ops(out) and rep["rules"]["cast_round_trip"] == 1


@pytest.mark.parametrize(("t", "u"), [(F, F16), (F, BF16), (F16, BF16), (BF16, F16), (I32, F), (F, I32), (F, B),
                                      (I64, F64), (F64, F), (I8, B), (T.INT16, F16), (T.UINT8, I8)])
def test_round_trip_kept_when_lossy(kit, folded, t: int, u: int) -> None:
    m = kit.make_model([cast("x", "a", u), cast("a", "y", t)], [("x", t, [16])], [("y", t, [16])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Cast", "Cast"] and not rep["rules"]


def test_fp32_fp16_int8_not_collapsed(kit, folded) -> None:
    m = kit.make_model([cast("x", "a", F16), cast("a", "y", I8)], [("x", F, [16])], [("y", I8, [16])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Cast", "Cast"] and not rep["rules"]


def test_f64_f32_f16_double_rounding_not_collapsed(kit, folded) -> None:
    m = kit.make_model([cast("x", "a", F), cast("a", "y", F16)], [("x", F64, [16])], [("y", F16, [16])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Cast", "Cast"] and not rep["rules"]


@pytest.mark.parametrize(("t", "u", "v"), [(F16, F, F64), (F, F64, F16), (I8, I32, F16), (B, F, I64),
                                           (F16, F, BF16), (T.UINT8, I32, B)])
def test_chain_collapsed_when_middle_embeds_source(kit, folded, t: int, u: int, v: int) -> None:
    m = kit.make_model([cast("x", "a", u), cast("a", "y", v)], [("x", t, [16])], [("y", v, [16])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Cast"] and out.graph.node[0].input[0] == "x" and rep["rules"]["cast_chain"] == 1


def test_float_to_int_truncation_chain_kept(kit, folded) -> None:
    m = kit.make_model([cast("x", "a", I32), cast("a", "y", F16)], [("x", F, [16])], [("y", F16, [16])])
    out, _ = folded(m)
    assert kit.ops(out) == ["Cast", "Cast"]


def test_inner_cast_kept_while_read_elsewhere(kit, folded) -> None:
    m = kit.make_model([cast("x", "a", F64), cast("a", "b", F), h.make_node("Add", ["b", "x"], ["y"]),
                        h.make_node("Neg", ["a"], ["z"])], [("x", F, [4])], [("y", F, [4]), ("z", F64, [4])])
    out, _ = folded(m)
    assert kit.ops(out) == ["Cast", "Add", "Neg"]


def test_round_trip_into_graph_output_renames_producer(kit, folded) -> None:
    m = kit.make_model([h.make_node("Relu", ["x"], ["r"]), cast("r", "a", F64), cast("a", "y", F)],
                       [("x", F, [4])], [("y", F, [4])])
    out, _ = folded(m)
    assert kit.ops(out) == ["Relu"] and out.graph.node[0].output[0] == "y"


def test_dead_nodes_removed_but_outputs_kept(kit, folded) -> None:
    m = kit.make_model([h.make_node("Relu", ["x"], ["dead1"]), h.make_node("Neg", ["dead1"], ["dead2"]),
                        h.make_node("Abs", ["x"], ["y"])], [("x", F, [4])], [("y", F, [4])])
    out, rep = folded(m)
    assert kit.ops(out) == ["Abs"] and rep["rules"]["dead_nodes"] == 2


def test_fold_is_idempotent_and_reports(kit) -> None:
    from trtforge.build_engine.passes import fold

    m = kit.make_model([cast("x", "a", F64), cast("a", "b", F), h.make_node("Identity", ["b"], ["y"])],
                       [("x", F, [4])], [("y", F, [4])])
    once = fold(m)
    twice = fold(once.model)
    assert twice.report.rules == {} and twice.model.graph == once.model.graph
    assert set(once.report.to_json()) >= {"nodes_before", "nodes_after", "removed", "rules", "seconds"}
