"""Whole-graph walks of the fold pipeline (op histogram, nested graphs), at C speed per node where it matters.

On a graph of 100k nodes, one Python call per node (``core.graph.may_have_subgraphs``) costs more than the rest of
such a walk; here the op types and domains are read in two comprehensions first
(``core.graph.any_may_have_subgraphs``), and nodes are looked at one by one only in the (rare) graphs that have a
control-flow or custom-domain node at all. The answers are those of
``core.graph.all_graphs`` for a graph that is not changed while it is walked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from operator import attrgetter

from onnx import GraphProto, ModelProto

from ..core.graph import nested_indices, subgraphs

_OP_TYPE = attrgetter("op_type")


def graphs_under(graph: GraphProto) -> Iterator[GraphProto]:
    """``graph`` and every graph nested in it at any depth, outer before inner (``core.graph.all_graphs``)."""
    yield graph
    nodes = graph.node
    for k in nested_indices(graph):
        for g in subgraphs(nodes[k]):
            yield from graphs_under(g)


def _count(graph: GraphProto, c: Counter[str]) -> bool:
    """Add ``graph``'s op types (and its subgraphs') to ``c``; whether ``graph`` has a node with subgraphs."""
    ops = list(map(_OP_TYPE, graph.node))
    c.update(ops)
    nested = nested_indices(graph, ops)
    for k in nested:
        for g in subgraphs(graph.node[k]):
            _count(g, c)
    return bool(nested)


def census(model: ModelProto) -> tuple[Counter[str], bool]:
    """(``op_histogram(model)``, whether the model is flat: no model-local function, no node carrying a subgraph)."""
    c: Counter[str] = Counter()
    nested = _count(model.graph, c)
    for fn in model.functions:
        c.update(map(_OP_TYPE, fn.node))
        for n in fn.node:
            for sg in subgraphs(n):
                for g in graphs_under(sg):
                    c.update(map(_OP_TYPE, g.node))
    return c, not nested and not model.functions


def op_histogram(model: ModelProto, flat: bool = False) -> Counter[str]:
    """Node count per op type over the main graph, every subgraph and every model-local function; ``flat``: the
    caller knows the model has neither (``census``), so only the main graph is read."""
    return Counter(map(_OP_TYPE, model.graph.node)) if flat else census(model)[0]
