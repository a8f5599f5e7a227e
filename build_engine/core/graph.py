"""Graph utilities every layer shares: value dims, dtype names, the subgraph walk and one stable topological sort.
Each exists once, here; passes, plugins, precision, engine and verify import it (the one shape-inference wrapper is
``shape_inference.infer_shapes``).

Subgraphs: a node may carry graph attributes (If/Loop/Scan/SequenceMap bodies, and any custom-domain node, whose
attributes are not known to ONNX). ``all_graphs`` yields a graph and every body nested in it, outer first.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto

Dim = int | str | None  # a dim_value, a dim_param, or unknown

# Protobuf cannot serialise a message of 2 GiB or more; the checker and inference serialise what they are given.
PROTO_LIMIT = 1_800_000_000


# ----------------------------------------------------------------------------------------------- dims and dtypes

def tensor_dims(vi: ValueInfoProto) -> tuple[Dim, ...] | None:
    """A tensor value's dims (static size, dim_param name, or None when unknown); None when its rank is unknown."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(int(d.dim_value) if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
                 for d in tt.shape.dim)


def _dtype_names() -> dict[int, str]:
    """ONNX element type -> numpy-style name (float32, float16, bfloat16, int64, bool, ...), from onnx's own table."""
    out: dict[int, str] = {}
    for elem in TensorProto.DataType.values():
        if elem == TensorProto.UNDEFINED:
            continue
        if elem == TensorProto.BFLOAT16:  # numpy has no bfloat16; onnx maps it to a uint16 carrier
            out[elem] = "bfloat16"
            continue
        try:
            out[elem] = str(onnx.helper.tensor_dtype_to_np_dtype(elem).name)
        except (KeyError, TypeError, ValueError):
            continue
    return out


DTYPE_NAMES: dict[int, str] = _dtype_names()
ELEM_TYPES: dict[str, int] = {name: elem for elem, name in DTYPE_NAMES.items()}  # the names are distinct


def dtype_name(elem_type: int | None) -> str:
    """ONNX element type -> its numpy-style name; ``elem_type N`` for an unknown or missing type."""
    return DTYPE_NAMES.get(elem_type or 0, f"elem_type {elem_type}")


def elem_type(name: str) -> int:
    """numpy-style dtype name -> ONNX element type (``KeyError`` for an unknown name)."""
    return ELEM_TYPES[name]


# ----------------------------------------------------------------------------------------------- subgraph walk

#: Default-domain ops that carry graph attributes; custom-domain nodes are always inspected.
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})
#: The same set, for callers that already hold a node's op type and domain (reading them off a proto again is slow).
CONTROL_FLOW_OPS = _CONTROL_FLOW
_DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})
_OP_TYPE = attrgetter("op_type")


def may_have_subgraphs(node: NodeProto) -> bool:
    return node.op_type in _CONTROL_FLOW or node.domain not in ("", "ai.onnx")


def any_may_have_subgraphs(nodes: Iterable[NodeProto], ops: Iterable[str] | None = None) -> bool:
    """``any(may_have_subgraphs(n) for n in nodes)``, read as two C-speed maps instead of a call per node (on a graph
    of 100k nodes the calls cost more than the rest of a walk); ``nodes`` is read twice (a repeated field or a list);
    ``ops``: their op types when already read."""
    return (not _CONTROL_FLOW.isdisjoint(map(_OP_TYPE, nodes) if ops is None else ops)
            or not {n.domain for n in nodes} <= _DEFAULT_DOMAINS)



def nested_indices(graph: GraphProto, ops: list[str] | None = None) -> list[int]:
    """Indices of the nodes of ``graph`` that may carry subgraphs (``may_have_subgraphs``), in node order; ``ops``:
    the nodes' op types when the caller has read them already."""
    nodes = graph.node
    if not any_may_have_subgraphs(nodes, ops):
        return []
    return [k for k, n in enumerate(nodes) if may_have_subgraphs(n)]

def subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def all_graphs(graph: GraphProto) -> Iterator[GraphProto]:
    """``graph`` and every If/Loop/Scan (or custom-op) body nested in it, outer before inner."""
    yield graph
    for n in graph.node:
        if may_have_subgraphs(n):
            for g in subgraphs(n):
                yield from all_graphs(g)


def model_nodes(model: ModelProto) -> Iterator[NodeProto]:
    """Every node of the model: main graph, nested bodies, model-local functions and the bodies nested in those."""
    for g in all_graphs(model.graph):
        yield from g.node
    for fn in model.functions:
        for n in fn.node:
            yield n
            for sub in subgraphs(n):
                for g in all_graphs(sub):
                    yield from g.node


def free_names(graph: GraphProto) -> set[str]:
    """Names a (sub)graph reads but does not define: its implicit inputs from enclosing scopes. A name it reads that
    only an initializer of its own defines counts too: onnxruntime and onnx.reference read an enclosing graph's
    value of that name there, when there is one."""
    defined = {i.name for i in graph.input}
    used: set[str] = set()
    for n in graph.node:
        defined.update(n.output)
        used.update(n.input)
        for g in subgraphs(n):
            used |= free_names(g)
    used.update(o.name for o in graph.output)
    used.discard("")
    return used - defined


def rename_free(graph: GraphProto, old: str, new: str) -> None:
    """Replace reads of outer name ``old`` by ``new`` throughout a subgraph (stops where ``old`` is redefined)."""
    if old in {i.name for i in graph.input} or any(t.name == old for t in graph.initializer):
        return
    for n in graph.node:
        for k, name in enumerate(n.input):
            if name == old:
                n.input[k] = new
        for g in subgraphs(n):
            rename_free(g, old, new)
        if old in n.output:
            return
    for o in graph.output:
        if o.name == old:
            o.name = new


# ----------------------------------------------------------------------------------------------- topological order

def stable_topo_order(deps: Sequence[set[int]]) -> list[int]:
    """Kahn's algorithm over node indices, ``deps[i]`` = the indices node ``i`` reads from.

    Stable: among the nodes that are ready, the lowest index goes first, so an order that is already valid comes
    back unchanged and an out-of-order one moves as little as possible. On a cycle the result is shorter than
    ``deps`` (the nodes on or behind the cycle are missing); callers compare lengths.
    """
    users: list[list[int]] = [[] for _ in deps]
    indeg = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    heap = [i for i, n in enumerate(indeg) if n == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        i = heapq.heappop(heap)
        out.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, u)
    return out


class Namer:
    """Fresh value/node names for a rewrite of ``model``'s main graph: ``namer(base)`` is ``base``, or ``base_1``,
    ``base_2``, ... when taken by a node's name, input or output, a graph input, output or initializer, or an earlier
    call. Quantize, precision and the Gemm lowering name what they add with it."""

    def __init__(self, model: ModelProto) -> None:
        g = model.graph
        self.used = {n for node in g.node for n in [*node.input, *node.output, node.name]}
        self.used |= {v.name for v in [*g.input, *g.output, *g.initializer]}

    def __call__(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name
