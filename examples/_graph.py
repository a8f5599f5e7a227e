"""A tiny ONNX graph writer that names nodes and tensors the way torch's exporter does.

Node ``/model/layers.0/self_attn/q_proj/MatMul`` produces ``/model/layers.0/self_attn/q_proj/MatMul_output_0``.
Only ``onnx.helper`` is used, so examples build without torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class GraphWriter:
    """Collects nodes and initializers; every ``op`` call returns the name(s) of the new node's output(s)."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = set()

    def _unique(self, name: str) -> str:
        # torch numbers repeated scopes as Op, Op_1, Op_2 ...; keep names unique the same way.
        if name not in self._names:
            self._names.add(name)
            return name
        i = 1
        while f"{name}_{i}" in self._names:
            i += 1
        self._names.add(f"{name}_{i}")
        return f"{name}_{i}"

    def op(self, op_type: str, inputs: list[str], name: str, n_out: int = 1, **attrs: Any) -> Any:
        node_name = self._unique(name)
        outputs = [f"{node_name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=node_name, **attrs))
        return outputs[0] if n_out == 1 else outputs

    def const(self, value: np.ndarray, name: str) -> str:
        """A ``Constant`` node (what exporters emit for small literals)."""
        return self.op("Constant", [], name, value=numpy_helper.from_array(np.asarray(value)))

    def const_i64(self, values: list[int], name: str) -> str:
        return self.const(np.asarray(values, dtype=np.int64), name)

    def cast(self, x: str, to: int, name: str) -> str:
        return self.op("Cast", [x], name, to=to)

    def initializer(self, array: np.ndarray, name: str) -> str:
        self.initializers.append(numpy_helper.from_array(array, name))
        return name


def np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


FLOAT = TensorProto.FLOAT
FLOAT16 = TensorProto.FLOAT16
INT64 = TensorProto.INT64
INT32 = TensorProto.INT32
