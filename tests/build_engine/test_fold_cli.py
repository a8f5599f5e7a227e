"""``trtforge fold``: report, --check, external data, and the bad-input contract (exit 2, one line, no output)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.passes.base import GraphPass
from trtforge.build_engine.passes.ir import GraphCtx
from trtforge_testing import assert_one_line_error


def _model(big: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    w = nh.from_array(rng.standard_normal((64, 64) if big else (4, 4)).astype(np.float32), "w")
    nodes = [h.make_node("Identity", ["x"], ["xi"]), h.make_node("Cast", ["xi"], ["x64"], to=T.DOUBLE),
             h.make_node("Cast", ["x64"], ["x32"], to=T.FLOAT), h.make_node("MatMul", ["x32", "w"], ["m"]),
             h.make_node("Cast", ["m"], ["m16"], to=T.FLOAT16), h.make_node("Cast", ["m16"], ["y"], to=T.FLOAT)]
    n = 64 if big else 4
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["batch", n])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", n])], initializer=[w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    return m


class _DropAnyCastPair(GraphPass):
    """A deliberately NOT exact pass: it removes every Cast-of-Cast pair, fp32->fp16->fp32 included."""

    name = "lossy"

    def rewrite(self, ctx: GraphCtx) -> int:
        n = 0
        for node in ctx.nodes:
            src = ctx.source(node.inputs[0]) if node.alive and node.op == "Cast" and node.inputs else None
            if src is not None and src.op == "Cast" and ctx.bypass(node, src.inputs[0], "lossy"):
                n += 1
        return n


def test_fold_writes_model_and_report(cli, tmp_path: Path) -> None:
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save_model(_model(), src)
    res = cli("fold", src, "-o", out, "--report", rep, "--check")
    assert res.code == 0, res.err
    report = json.loads(rep.read_text())
    assert report["nodes_before"] == 6 and report["nodes_after"] == 3
    assert report["removed"] == {"Cast": 2, "Identity": 1}
    assert report["check"]["passed"] is True and report["check"]["max_abs_diff"] == 0.0
    assert report["seconds"] >= 0 and "bit-identical" in res.out
    folded = onnx.load(out)
    assert [n.op_type for n in folded.graph.node] == ["MatMul", "Cast", "Cast"]  # fp32->fp16->fp32 stays


def test_check_equivalent_detects_a_lossy_fold() -> None:
    """A pass that is not exact is caught by --check (exercised with a deliberately lossy pass)."""
    from trtforge.build_engine.passes import fold
    from trtforge.build_engine.verify.bitwise import check_equivalent

    model = _model()
    bad = fold(model, passes=[_DropAnyCastPair()]).model
    res = check_equivalent(model, bad, seed=3)
    assert not res.passed and res.max_abs_diff > 0 and res.mismatched == ("y",)


def test_external_data_round_trip(cli, tmp_path: Path) -> None:
    src, out = tmp_path / "in.onnx", tmp_path / "o" / "out.onnx"
    out.parent.mkdir()
    onnx.save_model(_model(big=True), src, save_as_external_data=True, location="in.onnx.data", size_threshold=64)
    assert (tmp_path / "in.onnx.data").exists()
    res = cli("fold", src, "-o", out, "--check")
    assert res.code == 0, res.err
    assert (out.parent / "out.onnx.data").exists()
    stub = onnx.load(out, load_external_data=False)
    assert next(t for t in stub.graph.initializer if t.name == "w").data_location == T.EXTERNAL
    folded = onnx.load(out)
    w = next(t for t in folded.graph.initializer if t.name == "w")
    assert np.array_equal(nh.to_array(w), nh.to_array(_model(big=True).graph.initializer[0]))


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    cases: dict[str, tuple[Path, str]] = {}
    p = tmp_path / "text.onnx"
    p.write_text("this is not onnx\n" * 10)
    cases["not_onnx"] = (p, "text.onnx")
    full = _model().SerializeToString()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(full[: len(full) // 2])
    cases["truncated"] = (p, "trunc.onnx")
    for name, loc in (("missing", "gone.data"), ("absolute", "/etc/passwd"), ("dotdot", "../outside.data")):
        m = _model(big=True)
        t = m.graph.initializer[0]
        raw = t.raw_data or nh.from_array(nh.to_array(t)).raw_data
        t.ClearField("float_data")
        t.ClearField("raw_data")
        t.data_location = T.EXTERNAL
        for k, v in (("location", loc), ("offset", "0"), ("length", str(len(raw)))):
            t.external_data.add(key=k, value=v)
        p = tmp_path / f"{name}.onnx"
        p.write_bytes(m.SerializeToString())
        cases[name] = (p, f"{name}.onnx")
    m = _model()
    m.graph.node[0].input[0] = "y"  # Identity reads the last node's output: a cycle
    p = tmp_path / "cycle.onnx"
    p.write_bytes(m.SerializeToString())
    cases["cycle"] = (p, "cycle")
    m = _model()
    m.graph.node[3].input[1] = "nowhere"
    p = tmp_path / "dangling.onnx"
    p.write_bytes(m.SerializeToString())
    cases["dangling"] = (p, "nowhere")
    return cases


@pytest.mark.parametrize("case", ["not_onnx", "truncated", "missing", "absolute", "dotdot", "cycle", "dangling"])
def test_bad_input_exit_2_one_line_and_no_output(cli, tmp_path: Path, case: str) -> None:
    (tmp_path / "outside.data").write_bytes(b"\0" * 64 * 64 * 4)
    work = tmp_path / "models"
    work.mkdir()
    path, needle = _bad_inputs(work)[case]
    out, rep = tmp_path / "out" / "o.onnx", tmp_path / "out" / "r.json"
    out.parent.mkdir()
    res = cli("fold", path, "-o", out, "--report", rep)
    assert_one_line_error(res, 2, needle)
    assert list(out.parent.iterdir()) == []


def test_unwritable_output_folder_is_bad_input(cli, tmp_path: Path) -> None:
    src = tmp_path / "in.onnx"
    onnx.save_model(_model(), src)
    res = cli("fold", src, "-o", tmp_path / "no" / "such" / "out.onnx")
    assert_one_line_error(res, 2, "does not exist")


def test_check_uses_reference_for_fp16_models_and_token_ids_stay_in_vocab(cli, tmp_path: Path) -> None:
    emb = nh.from_array(np.random.default_rng(1).standard_normal((11, 4)).astype(np.float16), "emb")
    nodes = [h.make_node("Gather", ["emb", "ids"], ["e"]), h.make_node("Cast", ["e"], ["e32"], to=T.FLOAT),
             h.make_node("Cast", ["e32"], ["e16"], to=T.FLOAT16), h.make_node("Identity", ["e16"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", T.INT64, ["batch", "sequence"])],
                     [h.make_tensor_value_info("y", T.FLOAT16, ["batch", "sequence", 4])], initializer=[emb])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save_model(m, src)
    res = cli("fold", src, "-o", out, "--report", rep, "--check")
    assert res.code == 0, res.err
    report = json.loads(rep.read_text())
    assert report["check"]["runtime"] == "onnx.reference" and report["check"]["passed"]
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Gather"]
    from trtforge.build_engine.verify.inputs import random_feeds

    ids = random_feeds(m, seed=5)["ids"]
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 11 and ids.ndim == 2


def test_check_is_not_fooled_by_onnxruntime_weight_prepacking(tmp_path: Path) -> None:
    """MatMul(x, Identity(W)) -> MatMul(x, W) is exact, but onnxruntime pre-packs constant weights (another
    summation order); the check must disable that so an exact fold is not reported as a mismatch."""
    from trtforge.build_engine.passes import fold
    from trtforge.build_engine.verify.bitwise import check_equivalent

    rng = np.random.default_rng(3)
    w = nh.from_array(rng.standard_normal((256, 300)).astype(np.float32), "w")
    nodes = [h.make_node("Identity", ["w"], ["wi"]), h.make_node("MatMul", ["x", "wi"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["batch", 256])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", 300])], initializer=[w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    res = fold(m)
    assert [n.op_type for n in res.model.graph.node] == ["MatMul"]
    chk = check_equivalent(m, res.model, seed=1, runtime="onnxruntime")
    assert chk.passed and chk.max_abs_diff == 0.0


def test_cli_check_failure_exits_1_writes_report_but_not_model(cli, tmp_path: Path, monkeypatch) -> None:
    """The exit-1 path of --check, driven by a deliberately lossy pass swapped into the pipeline (the runtimes that
    judge are real)."""
    import trtforge.build_engine.passes.pipeline as pipeline

    monkeypatch.setattr(pipeline, "default_passes", lambda: (_DropAnyCastPair(),))
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save_model(_model(), src)
    res = cli("fold", src, "-o", out, "--report", rep, "--check")
    assert res.code == 1 and "OUTPUTS DIFFER" in res.out
    report = json.loads(rep.read_text())
    assert report["check"]["passed"] is False and report["check"]["max_abs_diff"] > 0
    assert not out.exists()


def test_low_precision_inside_a_function_picks_the_exact_judge() -> None:
    """A Cast to fp16 only inside a model-local function still makes --check judge with onnx.reference."""
    from trtforge.build_engine.verify.bitwise import uses_low_precision

    def model(to: int) -> onnx.ModelProto:
        fn = h.make_function("local", "RoundTrip", ["a"], ["b"],
                             [h.make_node("Cast", ["a"], ["t"], to=to), h.make_node("Cast", ["t"], ["b"], to=T.FLOAT)],
                             [h.make_opsetid("", 21)])
        g = h.make_graph([h.make_node("RoundTrip", ["x"], ["y"], domain="local")], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [4])], [h.make_tensor_value_info("y", T.FLOAT, [4])])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("local", 1)], functions=[fn])

    assert uses_low_precision(model(T.FLOAT16))
    assert not uses_low_precision(model(T.DOUBLE))


def test_summary_adds_up_when_casts_become_constants(cli, tmp_path: Path) -> None:
    # Cast(ConstantOfShape) and Cast(Range) fold to Constant nodes (graph outputs): the summary printed
    # "8 -> 3 nodes" and "removed: Cast 4, ConstantOfShape 2, Range 1" without the 2 Constants it added
    i64 = lambda v, name: nh.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [h.make_node("ConstantOfShape", ["shp"], ["c"], value=nh.from_array(np.array([65504.0], np.float16))),
             h.make_node("Cast", ["c"], ["cf"], to=T.FLOAT), h.make_node("Add", ["x", "cf"], ["y"]),
             h.make_node("Range", ["st", "lim", "dl"], ["r"]), h.make_node("Cast", ["r"], ["rf"], to=T.FLOAT),
             h.make_node("Cast", ["rf"], ["z"], to=T.INT32), h.make_node("ConstantOfShape", ["shp"], ["c0"]),
             h.make_node("Cast", ["c0"], ["w"], to=T.BOOL)]
    vi = h.make_tensor_value_info
    g = h.make_graph(nodes, "g", [vi("x", T.FLOAT, [4])], [vi("y", T.FLOAT, [4]), vi("z", T.INT32, [5]),
                                                           vi("w", T.BOOL, [4])],
                     initializer=[i64([4], "shp"), i64(10, "st"), i64(-3, "lim"), i64(-3, "dl")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    onnx.checker.check_model(m, full_check=True)
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save_model(m, src)
    res = cli("fold", src, "-o", out, "--report", rep, "--check")
    assert res.code == 0, res.err
    report = json.loads(rep.read_text())
    after = [n.op_type for n in onnx.load(out).graph.node]
    assert report["removed"] == {"Cast": 4, "ConstantOfShape": 2, "Range": 1} and report["added"] == {"Constant": 2}
    assert sorted(after) == ["Add", "Constant", "Constant"] and report["nodes_after"] == len(after) == 3
    text = " ".join(res.out.split())
    assert "8 -> 3 nodes" in text and "removed: Cast 4, ConstantOfShape 2, Range 1" in text
    assert "added: Constant 2" in text


def test_fold_help_names_what_every_rule_removes(cli) -> None:
    # fold --help says exactly what it removes: it named neither the duplicate-Cast merge, nor the Casts that go
    # because Shape/Size or Gather indices read past them, nor chains shortened across data movement
    from trtforge.build_engine.passes.pipeline import default_passes

    said = {"identity": "Identity", "same_type_cast": "no-ops", "cast_round_trip": "round trips",
            "cast_chain": "Cast chains", "constant_expression": "constant expression", "constant_cast": "Cast of a "
            "constant", "shape_of_cast": "Shape/Size", "gather_index_cast": "Gather/GatherElements read the int32",
            "duplicate_cast": "duplicate Casts", "sink_cast": "data-movement ops",
            "dead_nodes": "outputs nothing reads", "cast_like_to_cast": "CastLike whose target's type is known"}
    assert sorted(p.name for p in default_passes()) == sorted(said)
    res = cli("fold", "--help")
    text = " ".join(res.out.split())
    for rule, phrase in said.items():
        assert phrase in text, rule
