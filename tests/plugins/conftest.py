"""Tiny models and random pools for the LoRA plugin tests (built in code; fresh random data, never zeros)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtforge.plugins.lora import spec

NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


def single_op_model(x_shape: tuple, slot_shape: tuple, h: int, o: int, r: int, n: int,
                    dtype: type = np.float32) -> onnx.ModelProto:
    """One plugin node whose six inputs are graph inputs."""
    et = NP_TO_ONNX[np.dtype(dtype)]
    y_shape = (*x_shape[:-1], o)
    inputs = [helper.make_tensor_value_info("x", et, x_shape), helper.make_tensor_value_info("y", et, y_shape),
              helper.make_tensor_value_info("a", et, (n, h, r)), helper.make_tensor_value_info("b", et, (n, r, o)),
              helper.make_tensor_value_info("ids", TensorProto.INT32, slot_shape),
              helper.make_tensor_value_info("scales", TensorProto.FLOAT, (n,))]
    node = helper.make_node(spec.PLUGIN_NAME, ["x", "y", "a", "b", "ids", "scales"], ["out"], name="lora",
                            domain=spec.ONNX_DOMAIN, max_rank=r, num_slots=n, in_features=h, out_features=o, tile=64)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("out", et, y_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid(spec.ONNX_DOMAIN, 1)], ir_version=10)


@pytest.fixture(name="single_op_model")
def _single_op_model_fixture() -> Callable[..., onnx.ModelProto]:
    return single_op_model


@pytest.fixture
def pool() -> Callable[..., dict[str, np.ndarray]]:
    """Random x, y, pools, slot ids (including -1) and scales for given shapes."""

    def make(x_shape: tuple, slot_shape: tuple, h: int, o: int, r: int, n: int, dtype: type = np.float32,
             seed: int | None = None) -> dict[str, np.ndarray]:
        g = np.random.default_rng(seed)
        ids = g.integers(-1, n, size=slot_shape).astype(np.int32)
        ids.reshape(-1)[0] = -1  # always at least one token without an adapter
        if ids.size > 1:
            ids.reshape(-1)[1] = n - 1
        return {
            "x": g.standard_normal(x_shape).astype(dtype),
            "y": g.standard_normal((*x_shape[:-1], o)).astype(dtype),
            "a": (g.standard_normal((n, h, r)) / np.sqrt(h)).astype(dtype),
            "b": (g.standard_normal((n, r, o)) / np.sqrt(r)).astype(dtype),
            "ids": ids,
            "scales": g.uniform(0.5, 2.0, size=n).astype(np.float32),
        }

    return make
