"""The fast paths fold takes for scale give the answers of the slow definitions they replace.

- dead-node elimination revisits only nodes that lost a reader: same removals as a full reverse sweep after random
  rewiring, also on a graph that is not topologically sorted;
- the constant-expression filter (decided on demand, kept for the view's life) equals one sweep in node order, and
  the forward pre-filter from the constants' readers holds every value it accepts;
- ``census`` walks equal ``core.graph.all_graphs`` (control flow at depth, custom-domain nodes, functions);
- ``onnx_skeleton.skeleton_bytes`` is the skeleton's serialisation, with and without weights to stand in for.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from trtforge.build_engine.core import onnx_skeleton
from trtforge.build_engine.core.graph import all_graphs, nested_indices
from trtforge.build_engine.passes.census import graphs_under, op_histogram
from trtforge.build_engine.passes.const_expr import EXACT_OPS, FoldConstantExpression, _Computable, _from_constants
from trtforge.build_engine.passes.dead_nodes import RemoveDeadNodes
from trtforge.build_engine.passes.ir import GraphCtx, Scope

_OPS = ["Add", "Mul", "Relu", "Neg", "Cast", "Identity", "Sqrt"]


def _random_graph(rng: np.random.Generator, n: int, shuffle: bool = False) -> onnx.GraphProto:
    """``n`` float nodes over inputs x, c (a constant initializer) and a Constant; some outputs are read by nobody."""
    names = ["x", "c"]
    nodes = [h.make_node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(np.ones(3, np.float32)))]
    names.append("k")
    for i in range(n):
        op = _OPS[int(rng.integers(len(_OPS)))]
        arity = 2 if op in ("Add", "Mul") else 1
        ins = [names[int(rng.integers(len(names)))] for _ in range(arity)]
        attrs = {"to": T.FLOAT} if op == "Cast" else {}
        nodes.append(h.make_node(op, ins, [f"v{i}"], **attrs))
        names.append(f"v{i}")
    if shuffle:
        order = rng.permutation(len(nodes))
        nodes = [nodes[k] for k in order]
    outs = [h.make_tensor_value_info(names[-1], T.FLOAT, [3])]
    init = [onnx.numpy_helper.from_array(np.arange(3, dtype=np.float32), "c")]
    return h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [3])], outs, initializer=init)


def _ctx(g: onnx.GraphProto) -> GraphCtx:
    return GraphCtx(g, list(g.node), [i.name for i in g.input], [o.name for o in g.output], Scope(21, {}),
                    initializers=list(g.initializer))


def _rewire(ctx: GraphCtx, rng: np.random.Generator, k: int) -> None:
    """``k`` random reads redirected to another value defined earlier (so some producers lose their last reader)."""
    for _ in range(k):
        live = [n for n in ctx.nodes if n.alive and n.inputs]
        node = live[int(rng.integers(len(live)))]
        earlier = [o for m in ctx.nodes[:node.index] if m.alive for o in m.outputs] + ["x", "c"]
        ctx.set_input(node, int(rng.integers(len(node.inputs))), earlier[int(rng.integers(len(earlier)))])


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_dead_node_revisit_removes_what_a_full_sweep_removes(seed: int, shuffle: bool) -> None:
    rng = np.random.default_rng(seed)
    g = _random_graph(rng, 60, shuffle)
    fast, full = _ctx(g), _ctx(g)
    rule = RemoveDeadNodes()
    assert rule.rewrite(fast) == rule.rewrite(full)
    for step in range(4):
        r1, r2 = np.random.default_rng([seed, step]), np.random.default_rng([seed, step])
        _rewire(fast, r1, 5)
        _rewire(full, r2, 5)
        full.maybe_dead = None  # forces the whole reverse sweep
        assert rule.rewrite(fast) == rule.rewrite(full)
        assert [n.alive for n in fast.nodes] == [n.alive for n in full.nodes]
        assert fast.uses.keys() == full.uses.keys()


def _computable_by_sweep(ctx: GraphCtx) -> set[str]:
    """The definition the filter replaces: one sweep in node order."""
    out: set[str] = set()
    for n in ctx.nodes:
        if (n.alive and n.op in EXACT_OPS and n.onnx_op and not n.free
                and all(not i or i in out or ctx.constant_tensor(i) is not None for i in n.inputs)):
            out.update(o for o in n.outputs if o)
    return out


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_constant_expression_filter_equals_a_sweep(seed: int, shuffle: bool) -> None:
    rng = np.random.default_rng(100 + seed)
    ctx = _ctx(_random_graph(rng, 60, shuffle))
    expected = _computable_by_sweep(ctx)
    c = _Computable()
    names = [o for n in ctx.nodes for o in n.outputs] + ["x", "c"]
    order = rng.permutation(len(names))  # answers must not depend on the order questions come in
    for k in order:
        name = names[k]
        assert c.holds(ctx, name) == (name in expected), name
    assert expected <= _from_constants(ctx)  # the forward pre-filter never drops a value that qualifies
    assert FoldConstantExpression().rewrite(ctx) >= 0  # and the pass runs on the same view


def _nested_model() -> onnx.ModelProto:
    inner = h.make_graph([h.make_node("Neg", ["a"], ["ib"]), h.make_node("Identity", ["ib"], ["io"])], "inner", [],
                         [h.make_tensor_value_info("io", T.FLOAT, [3])])
    other = h.make_graph([h.make_node("Abs", ["a"], ["eo"])], "other", [],
                         [h.make_tensor_value_info("eo", T.FLOAT, [3])])
    mid = h.make_graph([h.make_node("If", ["flag"], ["mo"], then_branch=inner, else_branch=other)], "mid", [],
                       [h.make_tensor_value_info("mo", T.FLOAT, [3])])
    custom = h.make_node("Wrap", ["a"], ["co"], domain="my.domain", body=other)
    nodes = [h.make_node("Relu", ["x"], ["a"]),
             h.make_node("If", ["flag"], ["top"], then_branch=mid, else_branch=other),
             custom, h.make_node("Add", ["top", "co"], ["y"])]
    g = h.make_graph(nodes, "main", [h.make_tensor_value_info("x", T.FLOAT, [3]),
                                     h.make_tensor_value_info("flag", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [3])])
    fn = onnx.helper.make_function("local", "F", ["p"], ["q"], [h.make_node("If", ["p"], ["q"], then_branch=other,
                                                                            else_branch=other)],
                                   [h.make_opsetid("", 21)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("local", 1)], functions=[fn])


def test_census_walks_equal_all_graphs() -> None:
    m = _nested_model()
    assert [g.name for g in graphs_under(m.graph)] == [g.name for g in all_graphs(m.graph)]
    assert nested_indices(m.graph) == [1, 2]
    flat = _random_graph(np.random.default_rng(7), 30)
    assert nested_indices(flat) == [] and [g.name for g in graphs_under(flat)] == ["g"]
    expected: dict[str, int] = {}
    for g in all_graphs(m.graph):
        for n in g.node:
            expected[n.op_type] = expected.get(n.op_type, 0) + 1
    for n in m.functions[0].node:
        expected[n.op_type] = expected.get(n.op_type, 0) + 1
        for sub in (a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH):
            for g in all_graphs(sub):
                for x in g.node:
                    expected[x.op_type] = expected.get(x.op_type, 0) + 1
    assert dict(op_histogram(m)) == expected


@pytest.mark.parametrize("weights", [False, True])
def test_skeleton_bytes_is_the_skeletons_serialisation(weights: bool) -> None:
    rng = np.random.default_rng(3)
    size = onnx_skeleton.SKELETON_MIN_ELEMENTS * (2 if weights else 0) + 4
    w = onnx.numpy_helper.from_array(rng.standard_normal(size).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Concat", ["x", "w"], ["y"], axis=0)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [3])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     initializer=[w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    data = onnx_skeleton.skeleton_bytes(m)
    assert onnx.ModelProto.FromString(data) == onnx_skeleton.skeleton(m)
    assert (len(data) < m.ByteSize()) == weights


def test_dead_node_revisit_queues_a_node_once() -> None:
    """A candidate that a removal makes a candidate again: removed once, with everything that died after it."""
    g = h.make_graph([h.make_node("Relu", ["x"], ["a"]), h.make_node("Neg", ["a"], ["b"]),
                      h.make_node("Add", ["b", "a"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [3])])
    ctx = _ctx(g)
    rule = RemoveDeadNodes()
    assert rule.rewrite(ctx) == 0
    add = ctx.nodes[2]
    ctx.set_input(add, 0, "x")
    ctx.set_input(add, 1, "x")  # Relu and Neg are both candidates now; removing Neg makes Relu one again
    assert rule.rewrite(ctx) == 2
    assert [n.alive for n in ctx.nodes] == [False, False, True]


@pytest.mark.parametrize("seed", range(8))
def test_consumer_maps_equal_a_recount_and_protos_survive_commit(seed: int) -> None:
    """The view's compact consumer entries (one node read once, or a node -> reads dict) give what a recount of the
    live nodes' inputs gives, after random rewiring and dead-node removal; a node built from the graph's own node
    list reads its proto from there, and after ``commit`` (the removed protos cut out of the graph's node list, the
    survivors moved up) each survivor reads its own proto, with the rewritten inputs and outputs, in node order."""
    rng = np.random.default_rng(300 + seed)
    g = _random_graph(rng, 60)
    ctx = GraphCtx(g, g.node, [i.name for i in g.input], [o.name for o in g.output], Scope(21, {}),
                   initializers=list(g.initializer))
    rule = RemoveDeadNodes()
    for step in range(4):
        _rewire(ctx, np.random.default_rng([seed, step]), 5)
        rule.rewrite(ctx)
        reads: dict[str, dict[object, int]] = {}
        for n in ctx.nodes:
            for i in n.inputs if n.alive else ():
                reads.setdefault(i, {})
                reads[i][n] = reads[i].get(n, 0) + 1
        for name in set(reads) | set(ctx.uses):
            want = reads.get(name, {})
            assert set(ctx.consumers(name)) == set(want), name
            assert ctx.num_uses(name) - (name in ctx.output_set) == sum(want.values()), name
    for n in ctx.nodes:
        assert n.proto.SerializeToString() == g.node[n.index].SerializeToString()
    survivors = [(n.op, list(n.inputs), list(n.outputs)) for n in ctx.nodes if n.alive]
    ctx.commit(g.node)
    assert [(n.proto.op_type, n.proto.input[:], n.proto.output[:]) for n in ctx.nodes] == survivors
    assert [(p.op_type, p.input[:], p.output[:]) for p in g.node] == survivors


@pytest.mark.parametrize("seed", range(4))
def test_wide_node_positions_follow_every_rewire(seed: int) -> None:
    """A node reading more values than ``node._WIDE`` keeps a name -> positions map (so rewiring all its reads is
    linear in its width); after random ``replace_uses`` and ``set_input`` it gives what a scan of its inputs gives."""
    from trtforge.build_engine.passes.node import input_positions

    rng = np.random.default_rng(500 + seed)
    names = [f"v{k}" for k in range(20)]
    nodes = [h.make_node("Identity", ["x"], [v]) for v in names]
    reads = [names[int(rng.integers(len(names)))] for _ in range(90)]
    nodes.append(h.make_node("Sum", reads, ["y"]))
    g = h.make_graph(nodes, "wide", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])])
    ctx = GraphCtx(g, g.node, ["x"], ["y"], Scope(21, {}))
    wide = ctx.nodes[-1]
    for _ in range(40):
        old, new = (names[int(rng.integers(len(names)))] for _ in range(2))
        if rng.random() < 0.5:
            ctx.replace_uses(old, new)
        elif old in wide.inputs:
            ctx.set_input(wide, wide.inputs.index(old), new)
        for v in names:
            assert input_positions(wide, v) == [k for k, x in enumerate(wide.inputs) if x == v], v


def test_every_chain_below_one_cast_sinks_in_one_walk() -> None:
    """100 Reshape chains below Casts that duplicate-Cast merges into one: each chain's Cast is sunk and removed in
    the same walk (one per round before: 64 rounds left 36 of them)."""
    nodes = []
    for k in range(100):
        nodes += [h.make_node("Cast", ["x"], [f"a{k}"], to=T.DOUBLE), h.make_node("Reshape", [f"a{k}", "s"], [f"r{k}"]),
                  h.make_node("Cast", [f"r{k}"], [f"b{k}"], to=T.FLOAT)]
    nodes.append(h.make_node("Concat", [f"b{k}" for k in range(100)], ["y"], axis=0))
    g = h.make_graph(nodes, "fan", [h.make_tensor_value_info("x", T.FLOAT, [1])],
                     [h.make_tensor_value_info("y", T.FLOAT, [100])],
                     initializer=[onnx.numpy_helper.from_array(np.array([1], np.int64), "s")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    from trtforge.build_engine.passes import fold

    res = fold(model)
    assert sorted(set(n.op_type for n in res.model.graph.node)) == ["Concat", "Reshape"]
    assert len(res.model.graph.node) == 101
