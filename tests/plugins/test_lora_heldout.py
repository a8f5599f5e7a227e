"""Held-out LoRA layouts (QA session 24): a MatMul whose weight is stored [O, H] behind a Transpose (3-D x), a Gemm
with transB and a bias (2-D x); decompose against a float64 NumPy reference y = xW + scale * (x A_s) B_s per slot.
And a missing / folder / empty input names what is wrong (it said 'protobuf parse failed: the file is truncated')."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge_testing import assert_one_line_error

H, OUT_F, S = 8, 6, 5


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    inits = {"m.q_proj.weight": rng.standard_normal((OUT_F, H)), "m.k_proj.weight": rng.standard_normal((OUT_F, H)),
             "m.k_proj.bias": rng.standard_normal(OUT_F)}
    nodes = [h.make_node("Transpose", ["m.q_proj.weight"], ["wqT"], perm=[1, 0]),
             h.make_node("MatMul", ["x", "wqT"], ["q"], name="/m/q_proj/MatMul"),
             h.make_node("Gemm", ["x2", "m.k_proj.weight", "m.k_proj.bias"], ["k"], transB=1, name="/m/k_proj/Gemm")]
    vi = h.make_tensor_value_info
    graph = h.make_graph(nodes, "l", [vi("x", T.FLOAT, [2, S, H]), vi("x2", T.FLOAT, [2 * S, H])],
                         [vi("q", T.FLOAT, [2, S, OUT_F]), vi("k", T.FLOAT, [2 * S, OUT_F])],
                         [nh.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("target", "out", "x_name"), [("q_proj", "q", "x"), ("k_proj", "k", "x2")])
def test_decompose_matches_float64_reference(cli, tmp_path: Path, rng: np.random.Generator, target: str,
                                             out: str, x_name: str) -> None:
    import onnxruntime as ort

    src = _model(rng)
    onnx.save(src, tmp_path / "m.onnx")
    assert cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "i.onnx", "--targets", target,
               "--max-rank", "4", "--slots", "3").code == 0
    assert cli("lora", "decompose", tmp_path / "i.onnx", "-o", tmp_path / "d.onnx").code == 0
    w = {t.name: nh.to_array(t).astype(np.float64) for t in src.graph.initializer}
    x = rng.standard_normal((2, S, H)).astype(np.float32)
    x2 = rng.standard_normal((2 * S, H)).astype(np.float32)
    lead = x.shape[:-1] if x_name == "x" else x2.shape[:-1]
    path = f"m.{target}"
    a = rng.standard_normal((3, H, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4, OUT_F)).astype(np.float32)
    scales = rng.uniform(0.5, 2.0, 3).astype(np.float32)
    ids = rng.integers(-1, 3, size=lead).astype(np.int32)
    feeds = {"x": x, "x2": x2, "lora_slot_ids": ids, f"lora_a.{path}": a, f"lora_b.{path}": b,
             f"lora_scales.{path}": scales}
    sess = ort.InferenceSession(str(tmp_path / "d.onnx"))
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))[out]
    xx = (x if x_name == "x" else x2).astype(np.float64)
    ref = xx @ w[f"{path}.weight"].T + (w[f"{path}.bias"] if target == "k_proj" else 0.0)
    for idx in np.ndindex(*lead):
        s = ids[idx]
        if s >= 0:
            ref[idx] += scales[s] * (xx[idx] @ a[s].astype(np.float64) @ b[s].astype(np.float64))
    assert got.shape == ref.shape
    assert np.max(np.abs(got - ref)) <= 1e-4 * max(1.0, float(np.max(np.abs(ref))))


@pytest.mark.parametrize(("make", "needle"), [("missing", "no such file"), ("folder", "is a folder"),
                                              ("empty", "the file is empty")])
def test_bad_input_path_names_the_problem(cli, tmp_path: Path, make: str, needle: str) -> None:
    p = tmp_path / "in.onnx"
    if make == "folder":
        p.mkdir()
    elif make == "empty":
        p.write_bytes(b"")
    for argv in (("lora", "decompose", p, "-o", tmp_path / "o.onnx"),
                 ("lora", "inject", p, "-o", tmp_path / "o.onnx", "--targets", "q_proj")):
        assert_one_line_error(cli(*argv), 2, str(p), needle)
    assert not (tmp_path / "o.onnx").exists()
