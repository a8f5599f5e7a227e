"""Held-out projection layouts and input kinds for trtforge quantize (models built here, fresh random weights):
initializers the rewrite must keep (a weight that is also a graph output, a constant an If body captures) and
rank-0 inputs in generated and file calibration samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import CliResult

K, N, ROWS = 64, 48, 5


def _save(tmp_path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: dict[str, np.ndarray]) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "src.onnx"
    onnx.save(model, path)
    return path


def _session(path: Path) -> object:
    from trtforge.build_engine.verify.sessions import make_session

    return make_session(str(path))


def _weight(rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)


@pytest.mark.parametrize("mode", ["int8", "int4-wo", "fp8"])
def test_weight_that_is_a_graph_output_is_kept(mode: str, cli, tmp_path: Path, rng: np.random.Generator) -> None:
    """The MatMul is quantized; the graph output ``w`` still holds the float weight (it was dropped: the model
    failed onnx.checker, "Graph output 'w' is not an output of any node")."""
    w = _weight(rng)
    src = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Relu", ["h"], ["y"])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, K])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, N]),
                 helper.make_tensor_value_info("w", TensorProto.FLOAT, [K, N])], {"w": w})
    out = tmp_path / "q.onnx"
    res: CliResult = cli("quantize", src, "-o", out, "--mode", mode, "--calib-size", "2", "--block-size", "16")
    assert res.code == 0, res.err
    q = onnx.load(out)
    onnx.checker.check_model(q, full_check=True)
    assert next(n for n in q.graph.node if n.name == "mm").input[1] != "w"  # quantized
    x = rng.uniform(0, 1, (ROWS, K)).astype(np.float32)
    y, w_out = _session(out).run(None, {"x": x})  # type: ignore[attr-defined]
    assert w_out.tobytes() == w.tobytes()
    ref = np.maximum(x.astype(np.float64) @ w, 0)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 0.2


@pytest.mark.parametrize("calib", ["generated", "file"])
def test_initializer_read_by_an_if_body_and_a_scalar_bool_input(calib: str, cli, tmp_path: Path,
                                                                rng: np.random.Generator) -> None:
    """``c`` is read only inside the If's then-branch (outer-scope capture): the rewrite dropped it (the model
    failed onnx.checker). ``cond`` is a rank-0 bool input: its generated sample (a 0-d comparison) and sample k of
    a stacked file were NumPy scalars, which onnxruntime refuses ("Unable to handle object of type numpy.bool"),
    so quantize exited 2 blaming the calibration inputs' shapes."""
    c = rng.standard_normal(N).astype(np.float32)
    then_g = helper.make_graph([helper.make_node("Add", ["r", "c"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [ROWS, N])])
    else_g = helper.make_graph([helper.make_node("Identity", ["r"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [ROWS, N])])
    src = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Relu", ["h"], ["r"]),
                           helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, K]),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, N])], {"w": _weight(rng), "c": c})
    extra: list[str | Path] = ["--calib-size", "3"]
    if calib == "file":
        np.savez(tmp_path / "c.npz", x=rng.uniform(0, 1, (3, ROWS, K)).astype(np.float32),
                 cond=np.array([True, False, True]))
        extra = ["--calib", tmp_path / "c.npz"]
    out = tmp_path / "q.onnx"
    res = cli("quantize", src, "-o", out, "--mode", "int8", *extra)
    assert res.code == 0, res.err
    onnx.checker.check_model(onnx.load(out), full_check=True)
    x = rng.uniform(0, 1, (ROWS, K)).astype(np.float32)
    sess, ref = _session(out), _session(src)
    with_c = sess.run(None, {"x": x, "cond": np.array(True)})[0]  # type: ignore[attr-defined]
    without = sess.run(None, {"x": x, "cond": np.array(False)})[0]  # type: ignore[attr-defined]
    np.testing.assert_allclose(with_c - without, np.broadcast_to(c, (ROWS, N)), atol=1e-5)
    y_ref = ref.run(None, {"x": x, "cond": np.array(False)})[0]  # type: ignore[attr-defined]
    assert 0 < np.linalg.norm(without - y_ref) / np.linalg.norm(y_ref) < 0.1


V, H = 256, 64
_TAILS: dict[str, tuple[list[onnx.NodeProto], dict[str, np.ndarray]]] = {
    "softcap": ([helper.make_node("Div", ["l0", "cap"], ["l1"]), helper.make_node("Tanh", ["l1"], ["l2"]),
                 helper.make_node("Mul", ["l2", "cap"], ["logits"])], {"cap": np.array(30, np.float32)}),
    "temperature": ([helper.make_node("Div", ["l0", "temp"], ["logits"])], {"temp": np.array(0.7, np.float32)}),
    "bias-log-softmax": ([helper.make_node("Add", ["l0", "b"], ["l1"]),
                          helper.make_node("LogSoftmax", ["l1"], ["logits"], axis=-1)], {"b": np.zeros(V, np.float32)}),
}


@pytest.mark.parametrize("tail", sorted(_TAILS))
def test_lm_head_before_post_processing_stays_float(tail: str, tmp_path: Path, rng: np.random.Generator) -> None:
    """A head onto the vocabulary whose logits are post-processed before the output (Gemma's soft-capping, a
    temperature, a LogSoftmax) is still the LM head: it was quantized, the README says the head stays float."""
    from trtforge.build_engine.quantize.targets import select

    nodes, extra = _TAILS[tail]
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("MatMul", ["e", "w1"], ["h"], name="proj"),
         helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w_head"], ["l0"], name="head"),
         *nodes], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 8, V])],
        [numpy_helper.from_array(v.astype(np.float32) if v.ndim else v, k) for k, v in
         {"emb": rng.standard_normal((V, H)), "w1": rng.standard_normal((H, H)),
          "w_head": rng.standard_normal((H, V)), **extra}.items()])
    sel = select(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    assert [t.name for t in sel.targets] == ["proj"]
    assert [(e.name, e.reason) for e in sel.excluded] == [("head", "LM head (pass --quantize-lm-head to quantize it)")]


@pytest.mark.parametrize("rotary_cache", [False, True])
def test_v_proj_into_a_present_output_is_not_the_lm_head(rotary_cache: bool, rng: np.random.Generator) -> None:
    """``v_proj -> Reshape -> Transpose -> present.0.value`` (a decoder exported with KV outputs) is data movement
    to an output, but that output's last dim is the head size, not v_proj's out features: it is a projection to
    quantize (it was kept float as "LM head"). With a rotary cache ``Gather(cos [positions = H, 16], pos)`` (Llama-2:
    4096 positions, hidden 4096) its rows equal v_proj's out features: still no vocabulary (width 16, not H)."""
    from trtforge.build_engine.quantize.targets import select

    w = {k: numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), k)
         for k, s in (("wv", (H, H)), ("wq", (H, H)), ("wh", (H, V)))}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
         helper.make_node("Reshape", ["v", "shp"], ["v4"]),
         helper.make_node("Transpose", ["v4"], ["present.0.value"], perm=[0, 2, 1, 3]),
         helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"), helper.make_node("Relu", ["q"], ["r"]),
         helper.make_node("MatMul", ["r", "wh"], ["logits"], name="lm_head")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, H])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 8, V]),
         helper.make_tensor_value_info("present.0.value", TensorProto.FLOAT, [1, 4, 8, 16])],
        [*w.values(), numpy_helper.from_array(np.array([1, 8, 4, 16], np.int64), "shp")])
    if rotary_cache:
        graph.initializer.append(numpy_helper.from_array(rng.standard_normal((H, 16)).astype(np.float32), "cos"))
        graph.input.append(helper.make_tensor_value_info("pos", TensorProto.INT64, [1, 8]))
        graph.node.append(helper.make_node("Gather", ["cos", "pos"], ["cos_pos"]))
        graph.output.append(helper.make_tensor_value_info("cos_pos", TensorProto.FLOAT, [1, 8, 16]))
    sel = select(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    assert [t.name for t in sel.targets] == ["v_proj", "q_proj"]
    assert [e.name for e in sel.excluded] == ["lm_head"]


def _two_input_model(tmp_path: Path, rng: np.random.Generator) -> Path:
    """y = relu(x @ w + m), x [b, s, K] and m [b, s, 1]: two inputs sharing the dims b and s."""
    return _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                            helper.make_node("Add", ["h", "m"], ["h2"]), helper.make_node("Relu", ["h2"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", K]),
                  helper.make_tensor_value_info("m", TensorProto.FLOAT, ["b", "s", 1])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", N])], {"w": _weight(rng)})


def test_npy_file_and_inconsistent_named_dims_exit_2(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    """A .npy (the help names .npz) was an internal error (exit 3, "ndarray does not support the context manager
    protocol"); samples whose dims named ``s`` differ between inputs failed inside onnxruntime, which also printed
    its own coloured log line before trtforge's error (two lines on stderr)."""
    from trtforge_testing import assert_one_line_error

    src, out = _two_input_model(tmp_path, rng), tmp_path / "q.onnx"
    x = rng.standard_normal((3, 1, 5, K)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert_one_line_error(cli("quantize", src, "-o", out, "--mode", "int8", "--calib", tmp_path / "x.npy"), 2,
                          "x.npy", "numpy.savez")
    np.savez(tmp_path / "c.npz", x=x, m=np.zeros((3, 1, 7, 1), np.float32))
    assert_one_line_error(cli("quantize", src, "-o", out, "--mode", "int8", "--calib", tmp_path / "c.npz"), 2,
                          "c.npz", "input 'x' has 5 along dim 1 ('s') but input 'm' has 7")
    assert not out.exists()


def test_onnxruntime_failure_during_calibration_is_one_line(tmp_path: Path, rng: np.random.Generator) -> None:
    """A sample the file checks accept but the model cannot run (a Reshape to a fixed row count): one ``error:``
    line on stderr, no onnxruntime log line before it (run as a subprocess: onnxruntime logs from C++)."""
    from trtforge_testing import assert_one_line_error, run_console

    src = _save(tmp_path, [helper.make_node("Reshape", ["x", "shape"], ["x2"]),
                           helper.make_node("MatMul", ["x2", "w"], ["h"], name="mm"),
                           helper.make_node("Relu", ["h"], ["y"])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", K])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, N])],
                {"w": _weight(rng), "shape": np.array([ROWS, K], np.int64)})
    np.savez(tmp_path / "c.npz", x=rng.standard_normal((2, ROWS + 2, K)).astype(np.float32))
    res = run_console(["quantize", str(src), "-o", str(tmp_path / "q.onnx"), "--mode", "int8", "--calib",
                       str(tmp_path / "c.npz")])
    assert_one_line_error(res, 2, "calibration: onnxruntime cannot run the model")


def test_awq_report_states_the_relative_error_not_its_square(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    """The int4 report's "calibration rel. error X, rtn Y" were ||.||^2 ratios (0.0144 for a true 0.120): checked
    against ||x W - x Q(W)|| / ||x W|| recomputed here on the calibration rows with the stored RTN weights."""
    import json

    w = _weight(rng)
    src = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Relu", ["h"], ["y"])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, K])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, N])], {"w": w})
    x = rng.uniform(-1, 1, (40, ROWS, K)).astype(np.float32)  # 200 rows: all kept for the search (< 512)
    np.savez(tmp_path / "c.npz", x=x)
    outs = {}
    for method in ("awq", "rtn"):
        outs[method] = tmp_path / f"{method}.onnx"
        assert cli("quantize", src, "-o", outs[method], "--mode", "int4-wo", "--int4-method", method, "--calib",
                   tmp_path / "c.npz", "--block-size", "16", "--report", tmp_path / f"{method}.json").code == 0
    note = json.loads((tmp_path / "awq.json").read_text())["nodes"][0]["migration"]
    rtn_reported = float(note.split("rtn ")[1].rstrip(")"))
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(outs["rtn"]).graph.initializer}
    deq = inits["w_quantized"].astype(np.float64) * np.repeat(inits["w_scale"].astype(np.float64), 16, axis=0)
    rows = x.reshape(-1, K).astype(np.float64)
    true = np.linalg.norm(rows @ deq - rows @ w) / np.linalg.norm(rows @ w)
    assert 0.05 < true < 0.3  # int4 with 16-row blocks: about 0.1
    assert rtn_reported == pytest.approx(true, rel=0.01), (note, true)


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_weight_given_by_a_constant_node_is_quantized(op: str, cli, tmp_path: Path, rng: np.random.Generator) -> None:
    """An exporter without constant folding writes the weight as a ``Constant`` node: it was "nothing to quantize
    (no MatMul with a float32 weight)". The stored int8 weight dequantizes to the Constant's value (per channel)."""
    w = _weight(rng)
    value = numpy_helper.from_array(w.T.copy() if op == "Gemm" else w, "value")
    proj = (helper.make_node("Gemm", ["x", "w"], ["h"], name="proj", transB=1) if op == "Gemm"
            else helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"))
    src = _save(tmp_path, [helper.make_node("Constant", [], ["w"], value=value), proj,
                           helper.make_node("Relu", ["h"], ["y"])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, K])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, N])], {})
    np.savez(tmp_path / "c.npz", x=rng.uniform(-1, 1, (8, ROWS, K)).astype(np.float32))
    out = tmp_path / "q.onnx"
    res = cli("quantize", src, "-o", out, "--mode", "int8", "--calib", tmp_path / "c.npz", "--alpha", "0")
    assert res.code == 0, res.err
    q = onnx.load(out)
    onnx.checker.check_model(q, full_check=True)
    assert "Constant" not in {n.op_type for n in q.graph.node}
    inits = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in q.graph.initializer}
    qname = next(k for k in inits if k.endswith("_quantized"))
    scale = inits[qname.replace("_quantized", "_scale")]
    inv = next((v for k, v in inits.items() if k.endswith("_migration_inv_scale")), np.ones(K))
    deq = inits[qname] * scale[None, :] * inv[:, None]
    assert np.abs(deq - w).max() <= 0.5 * (scale[None, :] * inv[:, None]).max() * 1.001
    x = rng.uniform(-1, 1, (ROWS, K)).astype(np.float32)
    y, ref = _session(out).run(None, {"x": x})[0], np.maximum(x.astype(np.float64) @ w, 0)  # type: ignore[attr-defined]
    assert 0 < np.linalg.norm(y - ref) / np.linalg.norm(ref) < 0.05


@pytest.mark.parametrize(("opset", "mode"), [(17, "fp8"), (17, "int4-wo"), (11, "int8")])
def test_older_opset_is_converted_not_just_relabelled(opset: int, mode: str, cli, tmp_path: Path,
                                                      rng: np.random.Generator) -> None:
    """An RMSNorm written at opset 17 (ReduceMean's ``axes`` an attribute) and an Unsqueeze at opset 11: fp8 (opset
    19) and int4 (21) only declared the newer opset, and int8 (13) the same for opset 11, so the written model
    failed onnx.checker ("Unrecognized attribute: axes for operator ReduceMean") with exit 0."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("ReduceMean", ["x2"], ["ms"], axes=[-1]),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Div", ["x", "rms"], ["xn"]), helper.make_node("MatMul", ["xn", "w"], ["h"], name="mm"),
             helper.make_node("Unsqueeze", ["h"], ["hu"], axes=[0]) if opset < 13
             else helper.make_node("Unsqueeze", ["h", "zero"], ["hu"]), helper.make_node("Relu", ["hu"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, ROWS, N])],
                              [numpy_helper.from_array(_weight(rng), "w"),
                               numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
                               numpy_helper.from_array(np.array([0], np.int64), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    src, out = tmp_path / "src.onnx", tmp_path / "q.onnx"
    onnx.save(model, src)
    x = rng.standard_normal((8, ROWS, K)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=x)
    res = cli("quantize", src, "-o", out, "--mode", mode, "--calib", tmp_path / "c.npz", "--block-size", "16")
    assert res.code == 0, res.err
    q = onnx.load(out)
    onnx.checker.check_model(q, full_check=True)
    assert "QuantizeLinear" in {n.op_type for n in q.graph.node} or mode == "int4-wo"
    assert q.ir_version == {"int8": 7, "fp8": 9, "int4-wo": 10}[mode]
    feed = {"x": x[0]}
    y, ref = _session(out).run(None, feed)[0], _session(src).run(None, feed)[0]  # type: ignore[attr-defined]
    assert 0 < np.linalg.norm(y - ref) / np.linalg.norm(ref) < 0.25


@pytest.mark.parametrize(("mode", "extra"), [("int8", ("--calibrator", "entropy")), ("int4-wo", ()), ("fp8", ())])
def test_non_finite_activation_from_an_excluded_weight_exits_2(mode: str, extra: tuple[str, ...], cli, tmp_path: Path,
                                                               rng: np.random.Generator) -> None:
    """An inf weight kept float with ``--exclude`` (what the weight check advises) makes the next projection's
    input inf: int8's entropy calibrator crashed (internal error, exit 3) and int4 AWQ wrote a model (exit 0) after
    NumPy's RuntimeWarnings on stderr. Now one line naming the activation, whatever the mode."""
    from trtforge_testing import assert_one_line_error

    w1 = _weight(rng)
    w1[3, 4] = np.inf
    src = _save(tmp_path, [helper.make_node("MatMul", ["x", "w1"], ["h"], name="proj1"),
                           helper.make_node("Relu", ["h"], ["r"]),
                           helper.make_node("MatMul", ["r", "w2"], ["y0"], name="proj2"),
                           helper.make_node("Tanh", ["y0"], ["y"])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, K])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, K])],
                {"w1": w1, "w2": (rng.standard_normal((N, K)) / np.sqrt(N)).astype(np.float32)})
    out = tmp_path / "q.onnx"
    res = cli("quantize", src, "-o", out, "--mode", mode, "--calib-size", "2", "--exclude", "proj1",
              "--block-size", "16", *extra)
    assert_one_line_error(res, 2, "activation 'r' is NaN or infinite")
    assert not out.exists()


def test_matmuls_with_a_constant_that_is_not_a_weight_are_reported(rng: np.random.Generator) -> None:
    """W @ x, a 3-D weight, an fp16 weight and a tied head reading Transpose(embedding) stay float: they were
    missing from the report (neither quantized nor "kept float", so a float LM head went unmentioned) and a model
    of only such MatMuls said "no MatMul with a float32 weight". Attention's activation x activation MatMul is
    still not listed."""
    from trtforge.build_engine.quantize.targets import select

    f = TensorProto.FLOAT
    inits = {"w": rng.standard_normal((H, H)), "w_first": rng.standard_normal((8, 8)),
             "w3": rng.standard_normal((2, H, H)), "emb": rng.standard_normal((V, H))}
    arrays = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()]
    arrays.append(numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float16), "w16"))
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]),
             helper.make_node("MatMul", ["e", "w"], ["h"], name="proj"),
             helper.make_node("MatMul", ["w_first", "h"], ["h1"], name="first"),
             helper.make_node("MatMul", ["h1", "w3"], ["h2"], name="batched"),
             helper.make_node("Cast", ["h1"], ["h16"], to=TensorProto.FLOAT16),
             helper.make_node("MatMul", ["h16", "w16"], ["o16"], name="half"),
             helper.make_node("Transpose", ["h1"], ["h1t"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["h1", "h1t"], ["scores"], name="attn"),
             helper.make_node("Transpose", ["emb"], ["emb_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["h1", "emb_t"], ["logits"], name="tied_head")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
                              [helper.make_tensor_value_info("logits", f, [1, 8, V]),
                               helper.make_tensor_value_info("h2", f, [2, 8, H]),
                               helper.make_tensor_value_info("o16", TensorProto.FLOAT16, [1, 8, H]),
                               helper.make_tensor_value_info("scores", f, [1, 8, 8])], arrays)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    sel = select(model)
    assert [t.name for t in sel.targets] == ["proj"]
    reasons = {e.name: e.reason for e in sel.excluded}
    assert set(reasons) == {"first", "batched", "half", "tied_head"}
    assert "first input (W @ x)" in reasons["first"] and "is 3-D" in reasons["batched"]
    assert "'w16' is float16, not float32" in reasons["half"]
    assert "computed at run time (Transpose of 'emb')" in reasons["tied_head"]


def test_encoder_projection_matching_a_position_table_is_not_the_lm_head(rng: np.random.Generator) -> None:
    """BERT-medium geometry: hidden 64 = positions 64, so ``dense [64, 64]`` matches the position table, and a residual
    Add leads to ``last_hidden_state``: it was taken for a head onto the vocabulary (kept float). The vocabulary is
    the largest table (words, 256 rows), and logits post-processing reads no second activation."""
    from trtforge.build_engine.quantize.targets import select

    arrays = {"words": (V, H), "positions": (H, H), "dense": (H, H)}
    graph = helper.make_graph(
        [helper.make_node("Gather", ["words", "ids"], ["we"]), helper.make_node("Gather", ["positions", "pos"], ["pe"]),
         helper.make_node("Add", ["we", "pe"], ["e"]), helper.make_node("MatMul", ["e", "dense"], ["h"], name="dense"),
         helper.make_node("Add", ["h", "e"], ["last_hidden_state"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.INT64, [1, 8]) for n in ("ids", "pos")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, 8, H])],
        [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), k) for k, s in arrays.items()])
    sel = select(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    assert [t.name for t in sel.targets] == ["dense"] and not sel.excluded
