"""trtforge quantize: each mode's Q/DQ graph is valid ONNX, runs, stays close to fp32, and keeps the float parts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from quant_testing import TINY, held_out

from trtforge_testing import assert_one_line_error

# Measured on the tiny model with generated calibration (held-out seed 1234): int8 ~0.95, fp8 ~0.9, int4 ~0.7 top-1.
MIN_TOP1 = {"int8": 0.85, "fp8": 0.75, "int4-wo": 0.5}
MAX_REL = {"int8": 0.08, "fp8": 0.15, "int4-wo": 0.4}
KEEP_FLOAT = {"Softmax", "Pow", "ReduceMean", "Sqrt", "Reciprocal", "Sin", "Cos", "Range", "Gather", "Sigmoid"}


def _run(path: Path, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [sess.run(None, f)[0] for f in feeds]


@pytest.mark.parametrize("mode", ["int8", "int4-wo", "fp8"])
def test_mode_checks_runs_and_is_close(mode: str, quantized: dict[str, Path], tiny_path: Path) -> None:
    model = onnx.load(quantized[mode])
    onnx.checker.check_model(model, full_check=True)
    feeds = held_out()
    ref, got = _run(tiny_path, feeds), _run(quantized[mode], feeds)
    top1 = np.mean([np.mean(a.argmax(-1) == b.argmax(-1)) for a, b in zip(ref, got, strict=True)])
    rel = np.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(ref, got, strict=True)) / sum((a ** 2).sum() for a in ref))
    assert top1 >= MIN_TOP1[mode], (mode, top1)
    assert 0 < rel <= MAX_REL[mode], (mode, rel)


@pytest.mark.parametrize("mode", ["int8", "int4-wo", "fp8"])
def test_qdq_form_tensorrt_builds(mode: str, quantized: dict[str, Path]) -> None:
    """One float32 scale per MatMul operand, per-channel (or int4 block) weights, per-tensor activations."""
    model = onnx.load(quantized[mode])
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    stored = {"int8": TensorProto.INT8, "fp8": TensorProto.FLOAT8E4M3FN, "int4-wo": TensorProto.INT4}[mode]
    projections = [n for n in g.node if n.op_type == "MatMul" and n.input[1] in producer
                   and producer[n.input[1]].op_type == "DequantizeLinear"]
    assert len(projections) == 7 * TINY.layers
    for mm in projections:
        wdq = producer[mm.input[1]]
        w, scale = inits[wdq.input[0]], inits[wdq.input[1]]
        assert w.data_type == stored and scale.data_type == TensorProto.FLOAT
        attrs = {a.name: helper.get_attribute_value(a) for a in wdq.attribute}
        if mode == "int4-wo":
            assert attrs["axis"] == 0 and attrs["block_size"] in (128, 64, 32, 16)
            assert list(scale.dims) == [w.dims[0] // attrs["block_size"], w.dims[1]]
            assert producer[mm.input[0]].op_type != "DequantizeLinear"  # weight-only
        else:
            assert attrs["axis"] == 1 and list(scale.dims) == [w.dims[1]]
            adq = producer[mm.input[0]]
            assert adq.op_type == "DequantizeLinear" and inits[adq.input[1]].data_type == TensorProto.FLOAT
            assert list(inits[adq.input[1]].dims) == []  # per-tensor activation scale
            assert producer[adq.input[0]].op_type == "QuantizeLinear"


@pytest.mark.parametrize("mode", ["int8", "int4-wo", "fp8"])
def test_float_parts_stay_float(mode: str, quantized: dict[str, Path], tmp_path: Path) -> None:
    model = onnx.load(quantized[mode])
    producer = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type in KEEP_FLOAT:
            assert all(producer.get(i) is None or producer[i].op_type != "DequantizeLinear" for i in node.input)
        if node.op_type == "QuantizeLinear":
            consumers = [n for n in model.graph.node if node.output[0] in n.input]
            assert [c.op_type for c in consumers] == ["DequantizeLinear"]
    lm = next(n for n in model.graph.node if n.name == "/lm_head/MatMul")
    assert lm.input[1] in {t.name for t in model.graph.initializer}  # LM head: float weight
    report = json.loads((quantized[mode].parent / f"{mode}.json").read_text())
    assert {"name": "/lm_head/MatMul", "reason": "LM head (pass --quantize-lm-head to quantize it)"} in \
        report["excluded"]
    assert report["calibration"].startswith("generated from the model: 8 samples, seed 0")


def test_exclude_and_lm_head_flags(cli, tiny_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    res = cli("quantize", tiny_path, "-o", out, "--mode", "int8", "--exclude", "*/mlp/*,o_proj",
              "--quantize-lm-head", "--calib-size", "2")
    assert res.code == 0, res.err
    model = onnx.load(out)
    inits = {t.name for t in model.graph.initializer}
    by_name = {n.name: n for n in model.graph.node}
    for name in ("/model/layers.0/mlp/gate_proj/MatMul", "/model/layers.0/mlp/down_proj/MatMul",
                 "/model/layers.0/self_attn/o_proj/MatMul"):
        assert by_name[name].input[1] in inits  # still a float32 initializer
    assert by_name["/lm_head/MatMul"].input[1] not in inits
    assert "float: /model/layers.0/self_attn/o_proj/MatMul (--exclude 'o_proj')" in res.out


def test_exclude_pattern_that_matches_nothing_is_refused(cli, tiny_path: Path, tmp_path: Path) -> None:
    """``--exclude o_prj`` (a typo of o_proj) matched no node and was silently ignored: every projection was
    quantized, the one meant to stay float included. Each pattern must now match a node name, or exit 2."""
    out = tmp_path / "q.onnx"
    res = cli("quantize", tiny_path, "-o", out, "--mode", "int8", "--exclude", "o_proj,o_prj", "--calib-size", "2")
    assert res.code == 2 and "--exclude 'o_prj' matches no node name" in res.err, res.err
    assert len(res.err.strip().splitlines()) == 1 and not out.exists()


def test_policy_keeps_index_chain_matmul_float() -> None:
    """A MatMul on position arithmetic (Cast(Range) @ W) is what `trtforge precision` keeps in fp32: not quantized."""
    from trtforge.build_engine.quantize.targets import select

    w = numpy_helper.from_array(np.ones((1, 8), np.float32), "pos_w")
    w2 = numpy_helper.from_array(np.ones((8, 8), np.float32), "proj_w")
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
        helper.make_node("Range", ["zero", "n", "one"], ["r"]), helper.make_node("Unsqueeze", ["r", "ax"], ["r2"]),
        helper.make_node("Cast", ["r2"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["rf", "pos_w"], ["pe"], name="pos/MatMul"),
        helper.make_node("MatMul", ["x", "proj_w"], ["h"], name="proj/MatMul"),
        helper.make_node("Add", ["h", "pe"], ["h2"]), helper.make_node("Softmax", ["h2"], ["y"], axis=-1),
    ]
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("one", 1), ("zero", 0))]
    consts.append(numpy_helper.from_array(np.array([1], np.int64), "ax"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["s", 8])],
                              initializer=[w, w2, *consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    sel = select(model)
    assert [t.name for t in sel.targets] == ["proj/MatMul"]
    assert sel.excluded[0].name == "pos/MatMul" and "precision policy" in sel.excluded[0].reason


def test_calibrators_and_alpha(cli, tiny_path: Path, tmp_path: Path) -> None:
    """onnxruntime's percentile and entropy calibrators give ranges no wider than max's, from the same samples."""
    ranges = {}
    for cal in ("max", "percentile", "entropy"):
        rep = tmp_path / f"{cal}.json"
        res = cli("quantize", tiny_path, "-o", tmp_path / f"{cal}.onnx", "--mode", "int8", "--calibrator", cal,
                  "--calib-size", "4", "--report", rep)
        assert res.code == 0, res.err
        ranges[cal] = [n["act_amax"] for n in json.loads(rep.read_text())["nodes"]]
    for cal in ("percentile", "entropy"):
        assert all(0 < r <= m * 1.0001 for r, m in zip(ranges[cal], ranges["max"], strict=True)), cal


def test_already_quantized_and_same_path_refused(cli, quantized: dict[str, Path], tiny_path: Path,
                                                tmp_path: Path) -> None:
    res = cli("quantize", quantized["int8"], "-o", tmp_path / "again.onnx", "--mode", "int8")
    assert_one_line_error(res, 2, "already quantized")
    res = cli("quantize", tiny_path, "-o", tiny_path, "--mode", "int8")
    assert_one_line_error(res, 2, "same file")
    assert not (tmp_path / "again.onnx").exists()


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


BAD = {
    "wrong-name": ({"input_idz": np.zeros((2, 1, 8), np.int64)}, "input_idz"),
    "missing": ({}, "no arrays"),
    "wrong-rank": ({"input_ids": np.zeros((2, 2, 1, 8), np.int64)}, "input 'input_ids' has rank 4"),
    "wrong-dtype": ({"input_ids": np.zeros((2, 1, 8), np.float32)}, "input 'input_ids' has dtype float32"),
    "empty": ({"input_ids": np.zeros((0, 1, 8), np.int64)}, "input 'input_ids' is empty"),
    "out-of-range": ({"input_ids": np.full((2, 1, 8), TINY.vocab, np.int64)}, "input 'input_ids' holds values"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_calibration_files_exit_2(case: str, cli, tiny_path: Path, tmp_path: Path) -> None:
    arrays, needle = BAD[case]
    calib = _npz(tmp_path / "calib.npz", **arrays)
    out = tmp_path / "q.onnx"
    res = cli("quantize", tiny_path, "-o", out, "--mode", "int8", "--calib", calib)
    assert_one_line_error(res, 2, needle)
    assert not out.exists()


def test_nan_and_not_npz_and_good_file(cli, tmp_path: Path) -> None:
    """A float-input model: NaN in its samples is refused naming the input; a good file is used and stated."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["feats", "w"], ["h"], name="proj/MatMul"),
                               helper.make_node("Relu", ["h"], ["y"])], "g",
                              [helper.make_tensor_value_info("feats", TensorProto.FLOAT, ["b", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])], initializer=[w])
    src = tmp_path / "float_in.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), src)
    bad = np.ones((3, 4, 16), np.float32)
    bad[1, 2, 3] = np.nan
    res = cli("quantize", src, "-o", tmp_path / "q.onnx", "--mode", "fp8", "--calib",
              _npz(tmp_path / "n.npz", feats=bad))
    assert_one_line_error(res, 2, "input 'feats' holds NaN")
    (tmp_path / "junk.npz").write_text("not a zip")
    assert_one_line_error(cli("quantize", src, "-o", tmp_path / "q.onnx", "--mode", "int8", "--calib",
                              tmp_path / "junk.npz"), 2, "junk.npz")
    good = _npz(tmp_path / "g.npz", feats=np.random.default_rng(1).standard_normal((3, 4, 16)).astype(np.float32))
    res = cli("quantize", src, "-o", tmp_path / "q.onnx", "--mode", "int8", "--calib", good)
    assert res.code == 0, res.err
    assert f"calibration: file {good}: 3 samples" in res.out


def test_l40s_profile_allows_fp8_and_ampere_does_not() -> None:
    from trtforge.build_engine.engine.quantized import fp8_allowed
    from trtforge.profiles.loader import load_profile

    l40s = load_profile("l40s")
    hw = l40s.hardware
    assert (hw.compute_capability, hw.memory_gb, hw.memory_bandwidth_gbs, hw.sm_count) == ("8.9", 48.0, 864.0, 142)
    assert hw.fp8_tflops == 733.0 and fp8_allowed(l40s)
    assert not fp8_allowed(load_profile("a100")) and not fp8_allowed(load_profile("a10"))


def test_an_option_the_mode_does_not_read_is_named(cli, tiny_path: Path, tmp_path: Path) -> None:
    """``--mode fp8 --alpha 0.9`` ran as if --alpha were not given, without a word (it is int8's SmoothQuant
    strength): such an option is now named in one warning, and the run is the same as without it."""
    res = cli("quantize", tiny_path, "-o", tmp_path / "a.onnx", "--mode", "fp8", "--alpha", "0.9",
              "--block-size", "64", "--calib-size", "2")
    assert res.code == 0, res.err
    assert "--alpha applies to --mode int8 only; ignored for --mode fp8" in res.err
    assert "--block-size applies to --mode int4-wo only" in res.err
    plain = cli("quantize", tiny_path, "-o", tmp_path / "b.onnx", "--mode", "fp8", "--calib-size", "2")
    assert plain.code == 0 and "ignored" not in plain.err, plain.err
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_a_conv_is_listed_as_kept_float(cli, tmp_path: Path) -> None:
    """A Conv (and ConvTranspose / Einsum with a weight) is never quantized: the report now lists it among the float
    layers with that reason (it was missing from the report, which promises every layer that stays float)."""
    from trtforge_testing import seeded_rng

    rng = seeded_rng("quantize-conv-listed")
    wc = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "conv_w")
    wm = numpy_helper.from_array(rng.standard_normal((64, 16)).astype(np.float32), "proj_w")
    nodes = [helper.make_node("Conv", ["x", "conv_w"], ["c"], name="stem/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Flatten", ["c"], ["f"], axis=1),
             helper.make_node("MatMul", ["f", "proj_w"], ["h"], name="proj/MatMul"),
             helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], initializer=[wc, wm])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    src, out, rep = tmp_path / "m.onnx", tmp_path / "q.onnx", tmp_path / "q.json"
    onnx.save(model, src)
    res = cli("quantize", src, "-o", out, "--mode", "int8", "--report", rep)
    assert res.code == 0, res.err
    assert "stem/Conv (Conv is not quantized" in res.out
    report = json.loads(rep.read_text())
    assert "stem/Conv" in json.dumps(report) and "proj/MatMul" not in report.get("excluded", [])
    q = onnx.load(out)
    conv = next(n for n in q.graph.node if n.op_type == "Conv")
    assert conv.input[1] == "conv_w"  # still the float32 weight
    import onnxruntime as ort

    from trtforge.build_engine.verify.inputs import random_feeds

    feeds = random_feeds(model, int(rng.integers(1 << 30)))  # drawn as the calibration samples are
    ref = ort.InferenceSession(src.as_posix()).run(None, feeds)[0]
    got = ort.InferenceSession(out.as_posix()).run(None, feeds)[0]
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max()  # int8 on the projection only
