"""Helpers for pass tests: tiny models built in code, run with onnx.reference on fresh random inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h


def _make_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[tuple[str, int, list]],
                outputs: Sequence[tuple[str, int, list]], initializers: Sequence[onnx.TensorProto] = (),
                opset: int = 21, functions: Sequence[onnx.FunctionProto] = ()) -> onnx.ModelProto:
    g = h.make_graph(list(nodes), "g", [h.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                     [h.make_tensor_value_info(n, t, s) for n, t, s in outputs], initializer=list(initializers))
    opsets = [h.make_opsetid("", opset)] + ([h.make_opsetid("local", 1)] if functions else [])
    m = h.make_model(g, opset_imports=opsets, functions=list(functions))
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


def _feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Fresh random inputs that include the values casts care about: -0.0, +-inf, NaN, halves, large numbers."""
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        shape = [d.dim_value or 3 for d in tt.shape.dim]
        np_t = h.tensor_dtype_to_np_dtype(tt.elem_type)
        if tt.elem_type == T.BOOL:
            a = rng.random(shape) < 0.5
        elif np.issubdtype(np_t, np.integer):
            info = np.iinfo(np_t)
            a = rng.integers(info.min, int(info.max) + 1, size=shape, dtype=np_t)
        else:
            v = rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 8, size=shape)
            flat = v.reshape(-1)
            specials = [-0.0, np.inf, -np.inf, np.nan, 0.5, 2.5, 65520.0, 1e-8]
            k = min(len(specials), flat.size // 2)
            flat[rng.choice(flat.size, k, replace=False)] = specials[:k]
            with np.errstate(all="ignore"):
                a = v.astype(np_t)
        out[vi.name] = np.asarray(a)
    return out


def _assert_same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, seeds: Sequence[int] = (1, 2)) -> None:
    from onnx.reference import ReferenceEvaluator

    from trtforge.build_engine.verify.compare import compare_arrays

    for seed in seeds:
        feeds = _feeds(a, seed)
        with np.errstate(all="ignore"):
            oa = ReferenceEvaluator(a).run(None, feeds)
            ob = ReferenceEvaluator(b).run(None, feeds)
        assert len(oa) == len(ob)
        for x, y in zip(oa, ob, strict=True):
            d = compare_arrays(np.asarray(x), np.asarray(y))
            assert d.bitwise, (d.max_abs_unequal, x, y)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


class Kit:
    make_model = staticmethod(_make_model)
    feeds = staticmethod(_feeds)
    assert_same_outputs = staticmethod(_assert_same_outputs)
    ops = staticmethod(_ops)


@pytest.fixture
def kit() -> type[Kit]:
    return Kit


@pytest.fixture
def folded(kit: type[Kit]) -> Callable[[onnx.ModelProto], tuple[onnx.ModelProto, dict]]:
    """fold() a model, check the original is untouched and the outputs identical; return (model, report JSON)."""
    from trtforge.build_engine.passes import fold

    def run(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
        before = model.SerializeToString()
        res = fold(model)
        assert model.SerializeToString() == before, "fold mutated its input"
        kit.assert_same_outputs(model, res.model)
        assert [o.name for o in res.model.graph.output] == [o.name for o in model.graph.output]
        assert [i.name for i in res.model.graph.input] == [i.name for i in model.graph.input]
        return res.model, res.report.to_json()  # the --report JSON form, which the rule tests read by key

    return run
