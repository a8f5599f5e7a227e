"""CastLike -> Cast, round 6: ``round_mode`` (opset 24+), on which CastLike's schema and its function body part.

onnx.reference refuses a CastLike that carries ``round_mode``, so these cases are run in onnxruntime (graph
optimizations off), which expands CastLike into onnx's function body: a Cast with ``saturate`` alone.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from trtforge.build_engine.passes import fold
from trtforge_testing import seeded_rng


def _model(target: int, **attrs: object) -> onnx.ModelProto:
    """``y = float(CastLike(x, t, **attrs))`` at opset 24, ``t`` a one-element initializer of type ``target``."""
    nodes = [h.make_node("CastLike", ["x", "t"], ["c"], **attrs), h.make_node("Cast", ["c"], ["y"], to=T.FLOAT)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [64])],
                     [h.make_tensor_value_info("y", T.FLOAT, [64])], [h.make_tensor("t", target, [1], [1.0])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 24)])
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return m


def _ort(m: onnx.ModelProto, x: np.ndarray) -> bytes:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0]).tobytes()


def _feed(label: str) -> np.ndarray:
    """Fresh values away from powers of two (where the rounding modes part), with infinities and NaN."""
    rng = seeded_rng(label)
    x = (rng.uniform(1.1, 1.9, 64) * 2.0 ** rng.integers(-20, 20, 64)).astype(np.float32)
    x[:3] = [np.inf, -np.inf, np.nan]
    return x


@pytest.mark.parametrize("mode", ["down", "nearest"])
def test_a_round_mode_to_float8e8m0_keeps_the_cast_like(mode: str) -> None:
    # Cast(to=float8e8m0, round_mode='down') rounds 3.0 to 2.0 where CastLike's function body gives 4.0 (up): the
    # rewrite doubled or halved the outputs (fold --check: OUTPUTS DIFFER, max |diff| ~1e6)
    m = _model(T.FLOAT8E8M0, round_mode=mode)
    folded = fold(m).model
    assert [n.op_type for n in folded.graph.node] == ["CastLike", "Cast"]
    x = _feed(f"cast-like-e8m0-{mode}")
    assert _ort(folded, x) == _ort(m, x)


@pytest.mark.parametrize("target", [T.FLOAT8E4M3FN, T.FLOAT16])
def test_a_round_mode_to_another_type_is_not_copied_to_the_cast(target: int) -> None:
    # the Cast carried round_mode='down', which onnxruntime's Cast refuses for any type but float8e8m0 ("Attribute
    # round_mode is only used for cast to float8e8m0"): the folded model did not load where the input ran
    m = _model(target, round_mode="down", saturate=1 if target == T.FLOAT8E4M3FN else None)
    folded = fold(m).model
    (cast,) = [n for n in folded.graph.node if n.output[0] == "c"]
    assert cast.op_type == "Cast" and "round_mode" not in {a.name for a in cast.attribute}
    onnx.checker.check_model(folded, full_check=True)
    x = _feed(f"cast-like-round-mode-{target}")
    assert _ort(folded, x) == _ort(m, x)


def test_round_mode_up_to_float8e8m0_becomes_the_cast() -> None:
    """``up`` is the default of both readings: the rewrite is exact, and the Cast keeps the attribute."""
    m = _model(T.FLOAT8E8M0, round_mode="up")
    folded = fold(m).model
    (cast,) = [n for n in folded.graph.node if n.output[0] == "c"]
    assert cast.op_type == "Cast" and {a.name: a.s for a in cast.attribute if a.name == "round_mode"} == {
        "round_mode": b"up"}
    x = _feed("cast-like-e8m0-up")
    assert _ort(folded, x) == _ort(m, x)
