"""Held-out precision inputs (QA session 24): a decomposed LayerNorm and RMSNorm, Softmax, an int path
(Shape -> Gather -> Cast) and constants beyond the fp16 range. ``x * 1e5 - 1e5`` converted to fp16 used to run with
the constants clipped to 65504 (a third of the output's scale wrong); such nodes now stay fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.precision.convert import convert_precision
from trtforge_testing import assert_one_line_error


def _c(name: str, a: object) -> onnx.TensorProto:
    return nh.from_array(np.asarray(a, np.float32), name)


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    n = h.make_node
    nodes = [n("MatMul", ["x", "W1"], ["a"]), n("ReduceMean", ["a"], ["mu"], axes=[-1]), n("Sub", ["a", "mu"], ["d"]),
             n("Pow", ["d", "two"], ["d2"]), n("ReduceMean", ["d2"], ["var"], axes=[-1]),
             n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]), n("Div", ["d", "sd"], ["ln"]),
             n("MatMul", ["ln", "W2"], ["b"]), n("Mul", ["b", "b"], ["b2"]), n("ReduceMean", ["b2"], ["ms"], axes=[-1]),
             n("Add", ["ms", "eps"], ["mse"]), n("Sqrt", ["mse"], ["rms"]), n("Reciprocal", ["rms"], ["inv"]),
             n("Mul", ["b", "inv"], ["rn"]), n("Softmax", ["rn"], ["sm"], axis=-1), n("Shape", ["x"], ["shp"]),
             n("Gather", ["shp", "zero"], ["bs"], axis=0), n("Cast", ["bs"], ["bsf"], to=T.FLOAT),
             n("Mul", ["sm", "bsf"], ["y"]), n("Mul", ["x", "BIG"], ["xb"]), n("Add", ["xb", "NEG"], ["big"])]
    inits = [_c("W1", rng.standard_normal((16, 16)) * 0.5), _c("W2", rng.standard_normal((16, 16)) * 0.5),
             _c("two", 2.0), _c("eps", 1e-5), nh.from_array(np.array(0, np.int64), "zero"),
             _c("BIG", np.full(16, 1e5)), _c("NEG", np.full(16, -1e5))]
    vi = h.make_tensor_value_info
    graph = h.make_graph(nodes, "p", [vi("x", T.FLOAT, ["batch", 16])],
                         [vi("y", T.FLOAT, ["batch", 16]), vi("big", T.FLOAT, ["batch", 16]),
                          vi("ln", T.FLOAT, ["batch", 16])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("to", ["fp16", "bf16"])
def test_heldout_outputs_within_tolerance(rng: np.random.Generator, to: str) -> None:
    import onnxruntime as ort

    src = _model(rng)
    out = convert_precision(src, to).model
    onnx.checker.check_model(out, full_check=True)
    if to == "bf16":
        return  # onnxruntime's CPU provider has no bf16 MatMul: only the model's validity is checked
    x = (rng.standard_normal((3, 16)) * 3).astype(np.float32)
    ref = ort.InferenceSession(src.SerializeToString()).run(None, {"x": x})
    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})
    for name, a, b in zip(("y", "big", "ln"), got, ref, strict=True):
        scale = float(np.max(np.abs(b)))
        err = float(np.max(np.abs(a.astype(np.float64) - b)))
        assert a.dtype == np.float32 and err <= 2e-2 * scale, (to, name, err, scale)
    kept = {n.output[0] for n in out.graph.node if n.op_type in ("Mul", "Add") and n.output[0] in ("xb", "big")}
    assert kept == {"xb", "big"}  # the nodes with constants beyond 65504 run in fp32, on the unclipped constants
    big = {t.name: nh.to_array(t) for t in out.graph.initializer if t.name in ("BIG", "NEG")}
    assert len(big) == 2 and all(v.dtype == np.float32 and np.all(np.abs(v) == 1e5) for v in big.values())


def _if_model(rng: np.random.Generator) -> onnx.ModelProto:
    """``a = x @ W`` read from the outer scope by both branches of an If (the bodies are not converted)."""
    vi = h.make_tensor_value_info
    then = h.make_graph([h.make_node("Mul", ["a", "two"], ["o1"])], "then", [], [vi("o1", T.FLOAT, ["batch", 8])])
    other = h.make_graph([h.make_node("Neg", ["a"], ["o2"])], "else", [], [vi("o2", T.FLOAT, ["batch", 8])])
    nodes = [h.make_node("MatMul", ["x", "W"], ["a"]), h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["b"], then_branch=then, else_branch=other),
             h.make_node("MatMul", ["b", "W2"], ["y"])]
    graph = h.make_graph(nodes, "i", [vi("x", T.FLOAT, ["batch", 8])], [vi("y", T.FLOAT, ["batch", 8])],
                         [_c("W", rng.standard_normal((8, 8))), _c("W2", rng.standard_normal((8, 8))),
                          _c("two", 2.0), _c("zero", 0.0)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_value_read_by_a_subgraph_stays_fp32(rng: np.random.Generator, tmp_path) -> None:
    """Was 'precision conversion to fp16 produced an invalid model' (the If body's Mul read a now-fp16 'a'), and
    'trtforge build' of the model failed the same way."""
    import onnxruntime as ort

    from trtforge.build_engine.engine.builder import build_engine

    src = _if_model(rng)
    out = convert_precision(src, "fp16").model
    onnx.checker.check_model(out, full_check=True)
    for _ in range(3):  # fresh inputs take both branches
        x = rng.standard_normal((3, 8)).astype(np.float32)
        ref = ort.InferenceSession(src.SerializeToString()).run(None, {"x": x})[0]
        got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})[0]
        assert np.max(np.abs(got - ref)) <= 1e-2 * max(1.0, float(np.max(np.abs(ref))))
    onnx.save(src, tmp_path / "if.onnx")
    assert build_engine(tmp_path / "if.onnx", "a10", tmp_path / "e", progress=False).precision == "fp16"


def test_inconsistent_source_is_blamed_not_the_conversion(cli, tmp_path, rng: np.random.Generator) -> None:
    """A source whose declared output shape disagrees with its op (ArgMax keepdims=1 gives [2, 1], declared [2]):
    the error says the source fails strict inference, not that the conversion produced an invalid model."""
    w = nh.from_array(rng.standard_normal((3, 4)).astype(np.float32), "w")
    nodes = [h.make_node("MatMul", ["x", "w"], ["h"]), h.make_node("ArgMax", ["h"], ["y"], axis=1)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                              [h.make_tensor_value_info("y", T.INT64, [2])], [w])
    src = tmp_path / "src.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), src)
    res = cli("precision", src, "-o", tmp_path / "out.onnx", "--to", "fp16")
    assert_one_line_error(res, 2, "the source model fails strict shape inference", "fix the export")
    assert not (tmp_path / "out.onnx").exists()


def test_group_normalization_model_converts(cli, tmp_path, rng: np.random.Generator) -> None:
    """Conv -> GroupNormalization -> Conv (a diffusion UNet block) was refused with 'the source model fails strict shape
    inference ... fix the export': onnx 1.23 infers GroupNormalization's output type only with check_type, so the second
    Conv's input had no type. The model is valid (the checker passes, onnxruntime runs it)."""
    import onnxruntime as ort

    vi = h.make_tensor_value_info
    nodes = [h.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             h.make_node("GroupNormalization", ["a", "sc", "bi"], ["gn"], num_groups=2, epsilon=1e-5),
             h.make_node("Conv", ["gn", "w2"], ["y"], pads=[1, 1, 1, 1])]
    inits = [_c("w1", rng.standard_normal((4, 3, 3, 3)) * 0.3), _c("sc", rng.standard_normal(4) * 0.3 + 1),
             _c("bi", rng.standard_normal(4) * 0.3), _c("w2", rng.standard_normal((4, 4, 3, 3)) * 0.3)]
    graph = h.make_graph(nodes, "gn", [vi("x", T.FLOAT, ["N", 3, 8, 8])], [vi("y", T.FLOAT, ["N", 4, 8, 8])], inits)
    src = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])  # 18's GroupNormalization is deprecated
    onnx.checker.check_model(src, full_check=True)
    onnx.save(src, tmp_path / "gn.onnx")
    res = cli("precision", tmp_path / "gn.onnx", "-o", tmp_path / "gn16.onnx", "--to", "fp16")
    assert res.code == 0, res.err
    out = onnx.load(tmp_path / "gn16.onnx")
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node].count("GroupNormalization") == 1
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    ref = ort.InferenceSession(src.SerializeToString()).run(None, {"x": x})[0]
    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})[0]
    assert got.dtype == np.float32 and np.max(np.abs(got - ref)) <= 5e-3 * np.max(np.abs(ref))


def test_castlike_kept_fp32_keeps_its_float32_target(rng: np.random.Generator) -> None:
    """``CastLike(i, like)`` whose output an If body reads stays fp32 (rule 7) while ``like`` comes from a converted
    node: ``like`` was not cast back up (CastLike was among the ops whose input types do not matter), so CastLike
    returned fp16 where float32 was declared and the conversion failed ('produced an invalid model')."""
    import onnxruntime as ort

    vi = h.make_tensor_value_info
    body = h.make_graph([h.make_node("Mul", ["c", "two"], ["o1"])], "then", [], [vi("o1", T.FLOAT, ["batch", 8])])
    other = h.make_graph([h.make_node("Neg", ["c"], ["o2"])], "else", [], [vi("o2", T.FLOAT, ["batch", 8])])
    nodes = [h.make_node("MatMul", ["x", "W"], ["like"]), h.make_node("Cast", ["x"], ["i"], to=T.INT32),
             h.make_node("CastLike", ["i", "like"], ["c"]), h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             h.make_node("Greater", ["s", "zero"], ["cond"]),
             h.make_node("If", ["cond"], ["b"], then_branch=body, else_branch=other),
             h.make_node("Add", ["b", "like"], ["y"])]
    graph = h.make_graph(nodes, "cl", [vi("x", T.FLOAT, ["batch", 8])], [vi("y", T.FLOAT, ["batch", 8])],
                         [_c("W", rng.standard_normal((8, 8))), _c("two", 2.0), _c("zero", 0.0)])
    src = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    for to in ("fp16", "bf16"):
        out = convert_precision(src, to).model
        onnx.checker.check_model(out, full_check=True)
    out = convert_precision(src, "fp16").model
    for _ in range(2):  # both branches
        x = (rng.standard_normal((3, 8)) * 4).astype(np.float32)
        ref = ort.InferenceSession(src.SerializeToString()).run(None, {"x": x})[0]
        got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})[0]
        assert got.dtype == np.float32 and np.max(np.abs(got - ref)) <= 1e-2 * max(1.0, float(np.max(np.abs(ref))))


def test_fp16_model_to_bf16_says_what_stays_fp16(cli, tmp_path, rng: np.random.Generator) -> None:
    """--to bf16 on an fp16 model: the output is the fp16 model (16-bit to 16-bit is never converted), and the summary
    line alone ("OUT: bf16, 0 nodes converted") read as if it were bf16; a note now says what stayed float16."""
    vi = h.make_tensor_value_info
    w = nh.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float16), "w")
    graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "f16", [vi("x", T.FLOAT16, ["batch", 8])],
                         [vi("y", T.FLOAT16, ["batch", 8])], [w])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "f16.onnx")
    res = cli("precision", tmp_path / "f16.onnx", "-o", tmp_path / "o.onnx", "--to", "bf16")
    assert res.code == 0, res.err
    assert "note: " in res.err and "already holds 1 float16 initializer;" in res.err
    assert "convert the fp32 model" in res.err
    assert onnx.load(tmp_path / "o.onnx").graph.initializer[0].data_type == T.FLOAT16
    res = cli("precision", tmp_path / "f16.onnx", "-o", tmp_path / "p.onnx", "--to", "fp16")
    assert res.code == 0 and "note:" not in res.out + res.err
    # -q: "log only warnings and errors (no notes)"; the note went to stdout whatever -q said
    res = cli("precision", tmp_path / "f16.onnx", "-o", tmp_path / "q.onnx", "--to", "bf16", "-q")
    assert res.code == 0 and "note:" not in res.out + res.err


def test_castlike_to_a_float32_target_stays_float32(rng: np.random.Generator) -> None:
    """``CastLike(int32 ids, x)`` with a float32 ``x`` (a graph input) ran in fp16 after conversion, so ids beyond
    65504 became inf where the fp32 model gives the exact value; like ``Cast(to=FLOAT)`` it keeps its target now."""
    import onnxruntime as ort

    vi = h.make_tensor_value_info
    nodes = [h.make_node("CastLike", ["ids", "x"], ["f"]), h.make_node("MatMul", ["x", "W"], ["a"]),
             h.make_node("Add", ["a", "f"], ["y"])]
    graph = h.make_graph(nodes, "cl", [vi("x", T.FLOAT, ["batch", 8]), vi("ids", T.INT32, ["batch", 8])],
                         [vi("y", T.FLOAT, ["batch", 8]), vi("f", T.FLOAT, ["batch", 8])],
                         [_c("W", rng.standard_normal((8, 8)) * 0.1)])
    src = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    out = convert_precision(src, "fp16").model
    onnx.checker.check_model(out, full_check=True)
    (cast,) = [n for n in out.graph.node if "f" in n.output]  # CastLike(ids, x) or, folded, the Cast it denotes
    target = cast.input[1] if cast.op_type == "CastLike" else h.get_attribute_value(cast.attribute[0])
    assert target in ("x", T.FLOAT), cast  # the float32 input itself, or its type
    feeds = {"x": rng.standard_normal((2, 8)).astype(np.float32),
             "ids": rng.integers(60000, 200000, (2, 8)).astype(np.int32)}
    ref = ort.InferenceSession(src.SerializeToString()).run(None, feeds)
    got = ort.InferenceSession(out.SerializeToString()).run(None, feeds)
    assert np.array_equal(got[1], ref[1]) and np.all(np.isfinite(got[0]))


def test_padding_mask_beyond_fp16_stays_fp32_up_to_softmax(rng: np.random.Generator) -> None:
    """A Hugging Face padding mask ``(1 - mask) * finfo(float32).min`` added to fp16 scores: the Mul with the constant
    stayed fp32 (rule 8), but the Add read its output cast to fp16, i.e. -inf, and a fully padded sequence got NaN out
    of Softmax (judged exactly with onnx.reference; onnxruntime's CPU provider hides it by removing the Cast pair)."""
    from onnx.reference import ReferenceEvaluator

    d, vi = 16, h.make_tensor_value_info
    n = h.make_node
    nodes = [n("MatMul", ["x", "Wq"], ["q"]), n("MatMul", ["x", "Wk"], ["k"]), n("MatMul", ["x", "Wv"], ["v"]),
             n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), n("MatMul", ["q", "kt"], ["qk"]),
             n("Mul", ["qk", "scale"], ["s"]), n("Cast", ["attention_mask"], ["mf"], to=T.FLOAT),
             n("Sub", ["one", "mf"], ["inv"]), n("Mul", ["inv", "fmin"], ["ext"]),
             n("Unsqueeze", ["ext", "ax1"], ["ext3"]), n("Add", ["s", "ext3"], ["sm"]),
             n("Softmax", ["sm"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["y"])]
    inits = [*(_c(w, rng.standard_normal((d, d)) * 0.3) for w in ("Wq", "Wk", "Wv")), _c("scale", d ** -0.5),
             _c("one", 1.0), _c("fmin", np.finfo(np.float32).min), nh.from_array(np.array([1], np.int64), "ax1")]
    graph = h.make_graph(nodes, "hf", [vi("x", T.FLOAT, ["batch", "sequence", d]),
                                       vi("attention_mask", T.INT64, ["batch", "sequence"])],
                         [vi("y", T.FLOAT, ["batch", "sequence", d])], inits)
    src = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    out = convert_precision(src, "fp16").model
    assert next(x for x in out.graph.node if x.output[0] == "sm").input[1] == "ext3"  # the Add reads the fp32 mask
    feeds = {"x": rng.standard_normal((2, 5, d)).astype(np.float32),
             "attention_mask": np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], np.int64)}  # row 2: all padding
    ref = ReferenceEvaluator(src).run(None, feeds)[0]
    got = ReferenceEvaluator(out).run(None, feeds)[0]
    assert np.all(np.isfinite(got)) and np.max(np.abs(got - ref)) <= 1e-2 * np.max(np.abs(ref))


def test_wide_value_also_read_by_a_subgraph_still_spreads(rng: np.random.Generator) -> None:
    """``Where(x > 0, x, -1e9)`` whose output an If body also reads is kept for rule 7 first; its -1e9 must still keep
    its readers fp32 (the Add read it as fp16 -inf)."""
    from trtforge.build_engine.precision.convert import node_decisions

    vi = h.make_tensor_value_info
    body = h.make_graph([h.make_node("Neg", ["w"], ["o1"])], "then", [], [vi("o1", T.FLOAT, ["batch", 8])])
    other = h.make_graph([h.make_node("Identity", ["w"], ["o2"])], "else", [], [vi("o2", T.FLOAT, ["batch", 8])])
    nodes = [h.make_node("MatMul", ["x", "W"], ["a"]), h.make_node("Greater", ["x", "zero"], ["pos"]),
             h.make_node("Where", ["pos", "x", "big"], ["w"]), h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             h.make_node("Greater", ["s", "zero"], ["cond"]),
             h.make_node("If", ["cond"], ["b"], then_branch=body, else_branch=other),
             h.make_node("Add", ["a", "w"], ["y"])]
    graph = h.make_graph(nodes, "ws", [vi("x", T.FLOAT, ["batch", 8])],
                         [vi("y", T.FLOAT, ["batch", 8]), vi("b", T.FLOAT, ["batch", 8])],
                         [_c("W", rng.standard_normal((8, 8))), _c("zero", 0.0), _c("big", -1e9)])
    src = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    decisions = node_decisions(src, "fp16")
    add = next(i for i, nd in enumerate(src.graph.node) if nd.output[0] == "y")
    assert decisions[add].mode.value == "keep" and "beyond the fp16 range" in decisions[add].reason
    onnx.checker.check_model(convert_precision(src, "fp16").model, full_check=True)


def test_mask_beyond_fp16_kept_fp32_when_it_stays_on_disk(cli: Any, tmp_path: Path, rng: np.random.Generator) -> None:
    """A 1 MiB causal mask holding ``finfo(float32).min``, saved as external data: ``trtforge precision`` loads it
    lazily (it stays on disk), and rule 8 used to read only weights in memory, so the Add reading it ran in fp16 on
    the mask clipped to -65504. The weight is now read from its file: the Add stays fp32 on the unclipped mask."""
    n, vi = h.make_node, h.make_tensor_value_info
    mask = np.triu(np.full((512, 512), np.finfo(np.float32).min, np.float32), 1)
    nodes = [n("MatMul", ["x", "W"], ["s"]), n("Add", ["s", "M"], ["sm"]), n("Softmax", ["sm"], ["y"], axis=-1)]
    graph = h.make_graph(nodes, "mask", [vi("x", T.FLOAT, [512, 512])], [vi("y", T.FLOAT, [512, 512])],
                         [_c("W", rng.standard_normal((512, 512)) * 0.05), nh.from_array(mask, "M")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    src, out = tmp_path / "in" / "m.onnx", tmp_path / "out" / "m16.onnx"
    src.parent.mkdir()
    out.parent.mkdir()
    onnx.save(model, src, save_as_external_data=True, all_tensors_to_one_file=True, location="m.data")
    res = cli("precision", str(src), "--to", "fp16", "-o", str(out))
    assert res.code == 0, res.err
    got = onnx.load(out)
    onnx.checker.check_model(got, full_check=True)
    add = next(x for x in got.graph.node if x.op_type == "Add")
    kept = {t.name: nh.to_array(t, base_dir=str(out.parent)) for t in got.graph.initializer}
    assert kept[add.input[1]].dtype == np.float32 and np.array_equal(kept[add.input[1]], mask)
    types = {v.name: v.type.tensor_type.elem_type for v in [*got.graph.value_info, *got.graph.output]}
    assert types.get(add.output[0]) == T.FLOAT, types
