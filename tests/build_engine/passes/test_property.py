"""Property-based test: random graphs of Casts, Identities and elementwise/data-movement ops in several dtypes.

For every generated graph: folding keeps outputs bit-identical under onnx.reference on fresh random inputs (with
-0.0, inf, NaN and out-of-range values), the result passes onnx.checker and strict shape inference, and folding
the result again changes nothing (idempotence). ``FOLD_PROP_EXAMPLES`` sets the example count (default 300,
a few seconds; the file has also been run with 4000).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h

TYPES = [T.FLOAT, T.FLOAT16, T.BFLOAT16, T.DOUBLE, T.INT8, T.UINT8, T.INT32, T.INT64, T.BOOL]
NUMERIC = [t for t in TYPES if t != T.BOOL]
SIGNED = [T.FLOAT, T.FLOAT16, T.BFLOAT16, T.DOUBLE, T.INT8, T.INT32, T.INT64]
SHAPE = [2, 3]


def _round_trip(draw: st.DrawFn, nodes: list[onnx.NodeProto], name: str, t: int, out: str, k: int,
                moved: bool) -> int:
    """T -> U [-> data movement] -> T (or -> V): what the rules look for. Returns V."""
    u = draw(st.sampled_from(TYPES))
    v = draw(st.sampled_from([t, t, *TYPES]))
    nodes.append(h.make_node("Cast", [name], [f"u{k}"], to=u))
    mid = f"u{k}"
    if moved:
        nodes.append(h.make_node("Transpose", [mid], [f"m{k}"], perm=[1, 0]))
        nodes.append(h.make_node("Transpose", [f"m{k}"], [f"n{k}"], perm=[1, 0]))
        mid = f"n{k}"
    nodes.append(h.make_node("Cast", [mid], [out], to=v))
    return v


def _data_move(draw: st.DrawFn, nodes: list[onnx.NodeProto], name: str, out: str, k: int) -> None:
    """Reshape + Transpose, or two Transposes: data movement a Cast may sink through."""
    if draw(st.sampled_from(["Transpose2", "Reshape"])) == "Reshape":
        nodes.append(h.make_node("Reshape", [name, "shape32"], [f"r{k}"]))
        nodes.append(h.make_node("Transpose", [f"r{k}"], [out], perm=[1, 0]))
    else:
        nodes.append(h.make_node("Transpose", [name], [f"t{k}"], perm=[1, 0]))
        nodes.append(h.make_node("Transpose", [f"t{k}"], [out], perm=[1, 0]))


@st.composite
def graphs(draw: st.DrawFn) -> onnx.ModelProto:
    n_inputs = draw(st.integers(1, 2))
    pool: list[tuple[str, int]] = []
    inputs = []
    for k in range(n_inputs):
        t = draw(st.sampled_from(TYPES))
        inputs.append(h.make_tensor_value_info(f"in{k}", t, SHAPE))
        pool.append((f"in{k}", t))
    nodes: list[onnx.NodeProto] = []
    shapes: list[tuple[str, int]] = []
    inits = [onnx.numpy_helper.from_array(np.array([3, 2], np.int64), "shape32")]
    for k in range(draw(st.integers(1, 14))):
        name, t = draw(st.sampled_from(pool))
        out = f"v{k}"
        op = draw(st.sampled_from(["Cast", "Cast", "Cast", "Identity", "Unary", "Binary", "Move", "Shape",
                                   "RoundTrip", "RoundTrip", "MovedPair", "CastLike"]))
        if op in ("RoundTrip", "MovedPair"):
            v = _round_trip(draw, nodes, name, t, out, k, moved=op == "MovedPair")
            pool.append((out, v))
        elif op == "Cast":
            to = draw(st.sampled_from(TYPES))
            nodes.append(h.make_node("Cast", [name], [out], to=to))
            pool.append((out, to))
        elif op == "CastLike":  # to the type of any value so far (its values are never read)
            target, to = draw(st.sampled_from(pool))
            nodes.append(h.make_node("CastLike", [name, target], [out]))
            pool.append((out, to))
        elif op == "Identity":
            nodes.append(h.make_node("Identity", [name], [out]))
            pool.append((out, t))
        elif op == "Unary" and t in SIGNED:
            nodes.append(h.make_node(draw(st.sampled_from(["Neg", "Abs"])), [name], [out]))
            pool.append((out, t))
        elif op == "Binary" and t in NUMERIC:
            same = [p for p in pool if p[1] == t]
            other = draw(st.sampled_from(same))[0]
            nodes.append(h.make_node(draw(st.sampled_from(["Add", "Mul", "Max"])), [name, other], [out]))
            pool.append((out, t))
        elif op == "Move":
            _data_move(draw, nodes, name, out, k)
            pool.append((out, t))
        elif op == "Shape":  # its own little pool: [2] int64 values are only ever outputs
            nodes.append(h.make_node("Shape", [name], [out]))
            shapes.append((out, T.INT64))
    chosen = draw(st.lists(st.sampled_from(pool + shapes), min_size=1, max_size=3, unique_by=lambda p: p[0]))
    outputs = []
    for name, t in chosen:
        shape = [2] if (name, t) in shapes else SHAPE
        if name.startswith("in"):
            nodes.append(h.make_node("Identity", [name], [f"o_{name}"]))
            name = f"o_{name}"
        outputs.append(h.make_tensor_value_info(name, t, shape))
    g = h.make_graph(nodes, "random", inputs, outputs, initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    return m


@settings(max_examples=int(os.environ.get("FOLD_PROP_EXAMPLES", "300")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(graphs(), st.integers(0, 2**31 - 1))
def test_fold_is_exact_valid_and_idempotent(kit, model: onnx.ModelProto, seed: int) -> None:
    from trtforge.build_engine.passes import fold

    onnx.checker.check_model(model)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    res = fold(model)
    onnx.checker.check_model(res.model)
    onnx.shape_inference.infer_shapes(res.model, check_type=True, strict_mode=True)
    kit.assert_same_outputs(model, res.model, seeds=(seed, seed + 1))
    again = fold(res.model)
    assert again.report.rules == {}, again.report
    assert again.model.graph == res.model.graph
    assert [o.name for o in res.model.graph.output] == [o.name for o in model.graph.output]
    assert res.report.nodes_after <= res.report.nodes_before
