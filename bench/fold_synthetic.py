"""Synthetic graphs for the fold benchmark: N nodes of Cast round trips, chains, Identities, data movement and
arithmetic, in a long chain with side branches (so producer/consumer maps matter)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h


def synthetic(n_nodes: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    cur = "x"
    k = 0
    shape = onnx.numpy_helper.from_array(np.array([4, 8], np.int64), "shape")
    while len(nodes) < n_nodes:
        k += 1
        kind = int(rng.integers(0, 6))
        if kind == 0:  # exact round trip f32 -> f64 -> f32
            nodes += [h.make_node("Cast", [cur], [f"a{k}"], to=T.DOUBLE),
                      h.make_node("Cast", [f"a{k}"], [f"b{k}"], to=T.FLOAT)]
            cur = f"b{k}"
        elif kind == 1:  # lossy round trip (must stay) then Relu
            nodes += [h.make_node("Cast", [cur], [f"a{k}"], to=T.FLOAT16),
                      h.make_node("Cast", [f"a{k}"], [f"b{k}"], to=T.FLOAT),
                      h.make_node("Relu", [f"b{k}"], [f"c{k}"])]
            cur = f"c{k}"
        elif kind == 2:  # Identity + a dead side branch
            nodes += [h.make_node("Identity", [cur], [f"a{k}"]), h.make_node("Neg", [cur], [f"dead{k}"])]
            cur = f"a{k}"
        elif kind == 3:  # cast moved through data movement
            nodes += [h.make_node("Cast", [cur], [f"a{k}"], to=T.DOUBLE),
                      h.make_node("Reshape", [f"a{k}", "shape"], [f"b{k}"]),
                      h.make_node("Cast", [f"b{k}"], [f"c{k}"], to=T.FLOAT)]
            cur = f"c{k}"
        elif kind == 4:  # arithmetic with the input (fan-out of x grows)
            nodes += [h.make_node("Add", [cur, "x"], [f"a{k}"])]
            cur = f"a{k}"
        else:  # duplicate sibling casts
            nodes += [h.make_node("Cast", [cur], [f"a{k}"], to=T.FLOAT16),
                      h.make_node("Cast", [cur], [f"b{k}"], to=T.FLOAT16),
                      h.make_node("Add", [f"a{k}", f"b{k}"], [f"c{k}"]),
                      h.make_node("Cast", [f"c{k}"], [f"d{k}"], to=T.FLOAT)]
            cur = f"d{k}"
    nodes.append(h.make_node("Identity", [cur], ["y"]))
    g = h.make_graph(nodes, "synthetic", [h.make_tensor_value_info("x", T.FLOAT, [4, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [4, 8])], initializer=[shape])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    return m
