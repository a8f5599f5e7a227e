"""The verify package's single implementations: one input planner (fold --check and diff), one deterministic
onnxruntime session factory, one array comparison."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.verify.compare import compare_arrays
from trtforge.build_engine.verify.inputs import FeedSpec, draw, draw_feeds, plan_feeds, random_feeds
from trtforge.build_engine.verify.sessions import make_session, session_options


def _model() -> onnx.ModelProto:
    emb = nh.from_array(np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32), "emb")
    nodes = [h.make_node("Gather", ["emb", "ids"], ["e"]), h.make_node("Add", ["e", "x"], ["y"]),
             h.make_node("Identity", ["n"], ["k"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", T.INT64, ["batch", "seq"]),
                                  h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 3]),
                                  h.make_tensor_value_info("n", T.INT32, [4]),
                                  h.make_tensor_value_info("flag", T.BOOL, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", 3]),
                      h.make_tensor_value_info("k", T.INT32, [4])], initializer=[emb])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_plan_is_shared_and_bounded() -> None:
    specs = {s.name: s for s in plan_feeds(_model())}
    assert specs["ids"] == FeedSpec("ids", "int64", (2, 4), 0, 4)  # Gather index below the table's 5 rows
    assert specs["x"].shape == (2, 4, 3) and (specs["x"].low, specs["x"].high) == (-1.0, 1.0)
    assert specs["n"].high == 4  # untraced integer: below the smallest embedding table too
    assert specs["flag"].dtype == "bool"


def test_draw_is_seeded_and_respects_the_plan() -> None:
    specs = plan_feeds(_model(), values={"x": 0.5})
    a, b = draw_feeds(specs, 7), draw_feeds(specs, 7)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    assert (a["x"] == 0.5).all() and a["ids"].max() <= 4 and a["ids"].min() >= 0
    bf = draw(FeedSpec("h", "bfloat16", (64,), -1.0, 1.0), np.random.default_rng(1))
    assert bf.dtype.name == "bfloat16" and np.abs(bf.astype(np.float32)).max() <= 1.0
    assert not np.array_equal(random_feeds(_model(), 1)["x"], random_feeds(_model(), 2)["x"])


def test_session_factory_is_deterministic() -> None:
    import onnxruntime as ort

    opts = session_options()
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert opts.intra_op_num_threads == 1 and opts.log_severity_level == 4  # fatal: a failing kernel logs nothing
    assert opts.get_session_config_entry("session.disable_prepacking") == "1"
    assert session_options(optimize=True).graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    feeds = random_feeds(_model(), 3)
    out = make_session(_model()).run(None, feeds)
    emb = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    assert np.array_equal(out[0], emb[feeds["ids"]] + feeds["x"])


def test_compare_arrays_bitwise_and_tolerance_views() -> None:
    a = np.array([1.0, np.nan, -0.0, 2.0], np.float32)
    assert compare_arrays(a, a.copy()).bitwise
    signed = compare_arrays(a, np.array([1.0, np.nan, 0.0, 2.0], np.float32))
    assert not signed.bitwise and signed.max_abs_unequal == 0.0  # the sign of zero counts, at distance 0
    nan_vs_num = compare_arrays(a, np.array([1.0, 3.0, -0.0, 2.0], np.float32))
    assert not nan_vs_num.bitwise and nan_vs_num.max_abs_unequal == np.inf
    payload = np.array([np.nan], np.float32).view(np.uint32) | 1
    other_nan = compare_arrays(payload.view(np.float32), np.array([np.nan], np.float32))
    assert other_nan.bitwise and not other_nan.identical  # NaN == NaN for fold; bytes differ for diff's 0/0
    assert compare_arrays(a, a.astype(np.float64)).max_abs_unequal == np.inf  # dtype differs: not bit-equal
    ref = np.array([1.0, 100.0], np.float64)
    d = compare_arrays(np.array([1.001, 100.0], np.float32), ref, atol=1e-4, rtol=1e-2)
    assert d.mismatches == 0 and not d.same_type and abs(d.max_abs - 1e-3) < 1e-6
    assert compare_arrays(np.zeros(2), np.zeros(3)).mismatches == 3
