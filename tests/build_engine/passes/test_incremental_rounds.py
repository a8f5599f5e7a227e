"""Incremental walks reach the fixed point of whole walks.

After its first walk of a view, a pass that opts in walks only the Casts a rewrite touched since its previous walk
(``passes/dirty.py``). The marks are a filter, so what is folded stays exact; what could go wrong is a rewrite left
undone. These graphs are built so that rewrites enable each other across passes and rounds: a Cast sunk through a
chain of data movement that a dead reader blocks until dead-node elimination, round trips that appear only once a
chain is collapsed, duplicate Casts that appear once their inputs are merged, Casts of constants behind Identities,
values read far downstream (every value is 4x4, so any two combine). Each is folded with incremental walks and with
whole walks: the two models must be byte-identical, and the incremental one must keep every output bit
(onnx.reference, fresh inputs).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from trtforge_testing import seeded_rng

_spec = importlib.util.spec_from_file_location("_fold_prop_nested", Path(__file__).with_name("test_property_nested.py"))
assert _spec is not None and _spec.loader is not None
_nested = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_nested)

FLOATS = [T.FLOAT, T.DOUBLE, T.FLOAT16]
WIDER = {T.FLOAT: T.DOUBLE, T.FLOAT16: T.FLOAT, T.DOUBLE: T.DOUBLE}
MOVES = ["Transpose", "Identity", "Reshape", "Squeeze"]


class _Builder:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.pool: list[tuple[str, int]] = [("x", T.FLOAT)]
        self.k = 0

    def new(self) -> str:
        self.k += 1
        return f"v{self.k}"

    def add(self, op: str, ins: list[str], **attrs: object) -> str:
        out = self.new()
        self.nodes.append(h.make_node(op, ins, [out], **attrs))
        return out

    def move(self, name: str) -> str:
        op = MOVES[int(self.rng.integers(len(MOVES)))]
        if op == "Transpose":
            return self.add("Transpose", [name], perm=[1, 0])
        if op == "Reshape":
            return self.add("Reshape", [name, "shape"])
        if op == "Squeeze":
            return self.add("Squeeze", [self.add("Unsqueeze", [name, "axis"]), "axis"])
        return self.add("Identity", [name])

    def block(self) -> None:
        rng = self.rng
        name, t = self.pool[int(rng.integers(len(self.pool)))] if rng.random() < 0.3 else self.pool[-1]
        kind = int(rng.integers(6))
        u = WIDER[t] if rng.random() < 0.7 else FLOATS[int(rng.integers(len(FLOATS)))]
        if kind == 0:  # a Cast sunk through a chain of data movement, maybe blocked by a dead reader
            cur = self.add("Cast", [name], to=u)
            for _ in range(int(rng.integers(1, 5))):
                cur = self.move(cur)
                if rng.random() < 0.25:
                    self.add("Neg", [cur])  # dead: nothing reads it
            end = t if rng.random() < 0.7 else FLOATS[int(rng.integers(len(FLOATS)))]
            self.pool.append((self.add("Cast", [cur], to=end), end))
        elif kind == 1:  # a chain of three Casts (a round trip once the middle pair collapses)
            a = self.add("Cast", [name], to=u)
            b = self.add("Cast", [a], to=WIDER[u])
            self.pool.append((self.add("Cast", [b], to=t), t))
        elif kind == 2:  # duplicate Casts of values that become one
            a, b = self.add("Identity", [name]), self.add("Identity", [name])
            ca, cb = self.add("Cast", [a], to=u), self.add("Cast", [b], to=u)
            self.pool.append((self.add("Add", [ca, cb]), u))
        elif kind == 3:  # a Cast of a constant behind an Identity
            c = self.add("Cast", [self.add("Identity", ["w"])], to=t)
            self.pool.append((self.add("Add", [name, c]) if t == T.FLOAT else name, t))
        elif kind == 4:  # arithmetic on an older value of the same type
            same = [p for p in self.pool if p[1] == t]
            other = same[int(rng.integers(len(same)))][0]
            self.pool.append((self.add("Mul", [name, other]), t))
        else:  # a lossy round trip (stays), then Relu
            a = self.add("Cast", [self.add("Cast", [name], to=T.FLOAT16)], to=t)
            self.pool.append((self.add("Relu", [a]), t))

    def model(self) -> onnx.ModelProto:
        outs = {self.pool[-1][0]: self.pool[-1][1]}
        for name, t in self.pool[1:]:
            if self.rng.random() < 0.05:
                outs[name] = t
        inits = [onnx.numpy_helper.from_array(np.array([4, 4], np.int64), "shape"),
                 onnx.numpy_helper.from_array(np.array([0], np.int64), "axis"),
                 onnx.numpy_helper.from_array(self.rng.standard_normal((4, 4)).astype(np.float32), "w")]
        g = h.make_graph(self.nodes, "chains", [h.make_tensor_value_info("x", T.FLOAT, [4, 4])],
                         [h.make_tensor_value_info(n, t, [4, 4]) for n, t in outs.items()], initializer=inits)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
        m.ir_version = 10
        return m


def chains(label: str, blocks: int) -> onnx.ModelProto:
    b = _Builder(seeded_rng(label))
    for _ in range(blocks):
        b.block()
    return b.model()


def _fold(model: onnx.ModelProto, incremental: bool) -> onnx.ModelProto:
    from trtforge.build_engine.passes.pipeline import Pipeline

    m = onnx.ModelProto()
    m.CopyFrom(model)
    Pipeline(incremental=incremental).call(m)
    return m


@pytest.mark.parametrize("seed", range(8))
def test_incremental_walks_reach_the_whole_walks_fixed_point(kit, seed: int) -> None:
    model = chains(f"incremental-{seed}", 120)
    onnx.checker.check_model(model, full_check=True)
    fast, whole = _fold(model, True), _fold(model, False)
    assert fast.SerializeToString() == whole.SerializeToString()
    assert len(fast.graph.node) < len(model.graph.node)
    kit.assert_same_outputs(model, fast, seeds=(seed,))


@pytest.mark.parametrize("wrap", ["if", "function"])
def test_incremental_walks_in_branches_and_functions(wrap: str) -> None:
    model = chains(f"incremental-{wrap}", 60)
    wrapped = _nested.wrap_in_if(model) if wrap == "if" else _nested.wrap_in_function(model)
    onnx.checker.check_model(wrapped)
    assert _fold(wrapped, True).SerializeToString() == _fold(wrapped, False).SerializeToString()


def test_a_cast_blocked_by_a_dead_reader_is_sunk_in_a_later_round() -> None:
    """The dead Neg makes the Reshape's output read twice: sinking waits for dead-node elimination, which runs last in
    a round; only the mark that the lost reader leaves on the chain's first Cast brings the next round back to it."""
    nodes = [h.make_node("Cast", ["x"], ["a"], to=T.DOUBLE), h.make_node("Reshape", ["a", "shape"], ["b"]),
             h.make_node("Neg", ["b"], ["dead"]), h.make_node("Cast", ["b"], ["y"], to=T.FLOAT)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [3, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [4, 3])],
                     initializer=[onnx.numpy_helper.from_array(np.array([4, 3], np.int64), "shape")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    folded = _fold(model, True)
    assert [n.op_type for n in folded.graph.node] == ["Reshape"]


def test_a_round_trip_that_sinking_exposes_two_nodes_down_is_collapsed() -> None:
    """Sinking retypes the Transpose's output to float16; the round trip then sits at the reader of the Cast that reads
    it (two nodes below the retyped value), which only the marks a retype leaves bring back in a later round."""
    nodes = [h.make_node("Cast", ["x"], ["a"], to=T.DOUBLE), h.make_node("Transpose", ["a"], ["b"], perm=[1, 0]),
             h.make_node("Cast", ["b"], ["c"], to=T.FLOAT), h.make_node("Cast", ["c"], ["d"], to=T.FLOAT16),
             h.make_node("Neg", ["d"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT16, [3, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT16, [4, 3])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    folded = _fold(model, True)
    assert [n.op_type for n in folded.graph.node] == ["Transpose", "Neg"]
    assert folded.SerializeToString() == _fold(model, False).SerializeToString()
