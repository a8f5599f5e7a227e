"""The pass view's node (``Node``) and its consumer entries (``Uses``): what ``ir.GraphCtx`` keeps per node and per
value, kept small because a graph of light nodes costs mostly this (a 100k-node graph of 32 serialized bytes per node).

- A node built from a graph's node list keeps no proto wrapper: it reads ``src[index]`` when asked (``proto``), and
  holds its own proto only when the view made it (``replace_node``, until ``GraphCtx.commit`` copies it in).
- A value read once, by one node, has that node as its ``uses`` entry; a dict ``node -> reads`` only from a second
  read on (``add_use`` / ``drop_use`` / ``readers`` keep the two forms equivalent: a recount of the live nodes' inputs
  gives the same readers and counts, ``tests/build_engine/passes/test_scale_paths.py``).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from sys import intern
from typing import Protocol

from onnx import AttributeProto, NodeProto


class NodeList(Protocol):
    """A graph's (or function's) repeated ``node`` field, as ``GraphCtx.commit`` changes it."""

    def __len__(self) -> int: ...

    def __getitem__(self, k: int) -> NodeProto: ...

    def __delitem__(self, k: slice) -> None: ...

    def sort(self, *, key: Callable[[NodeProto], int]) -> None: ...


@dataclass(eq=False, slots=True)
class Node:
    own: NodeProto | None  # the proto, for a node the view made (``replace_node``); None: ``src[index]``
    src: Sequence[NodeProto] | NodeList | None  # the node list the proto is read from (no wrapper kept per node)
    op: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    free: frozenset[str]  # names of this scope read by the node's subgraphs
    alive: bool = True
    dirty: bool = False
    to: int | None = None  # a default-domain Cast's target type (None: not a Cast, or a function attr reference)
    subdefs: frozenset[str] | None = None  # names defined anywhere inside this node's subgraphs (lazy)
    onnx_op: bool = False  # default domain (set by ``make_node``: read in every pass's inner loop)
    index: int = -1  # position in the view's node list (``GraphCtx.position``)
    touched: int = 0  # ``GraphCtx.clock`` when a rewrite last changed what a rule sees here (``dirty``)
    positions: dict[str, list[int]] | None = None  # name -> where it is read, for a wide node (``input_positions``)

    @property
    def proto(self) -> NodeProto:
        p = self.own
        return p if p is not None else self.src[self.index]  # type: ignore[index]

    def attr(self, name: str) -> AttributeProto | None:
        for a in self.proto.attribute:
            if a.name == name:
                return a
        return None

    def int_attr(self, name: str) -> int | None:
        """An int attribute's value; None when absent or a function attribute reference (unknown here)."""
        return _int_attr(self.proto, name)

    @property
    def is_cast(self) -> bool:
        """A default-domain Cast with a known target type and a named input."""
        return self.to is not None and self.alive and bool(self.inputs) and bool(self.inputs[0])


ALIVE = attrgetter("alive")  # a live node (``GraphCtx.casts`` filters on it at C speed)


def make_node(p: NodeProto, free: frozenset[str], src: Sequence[NodeProto] | None = None, index: int = -1) -> Node:
    """The view's node for ``p``; ``src[index]`` is ``p`` when given (then the node reads its proto from there)."""
    op, domain = intern(p.op_type), intern(p.domain)  # one string per op type, not one per node
    # a slice is a plain list, made faster than list()
    n = Node(p if src is None else None, src, op, domain, p.input[:], p.output[:], free, index=index)
    n.onnx_op = onnx_op = domain == "" or domain == "ai.onnx"
    if op == "Cast" and onnx_op:
        n.to = _int_attr(p, "to")
    return n


def _int_attr(p: NodeProto, name: str) -> int | None:
    """``Node.int_attr`` of the node whose proto is ``p``."""
    for a in p.attribute:
        if a.name == name:
            return None if a.ref_attr_name or a.type != AttributeProto.INT else a.i
    return None


_WIDE = 32  # a node reading more values than this keeps the positions of its reads (``input_positions``)


def input_positions(n: Node, name: str) -> list[int]:
    """Where ``n`` reads ``name``, in order. A wide node (a Concat or Sum of thousands) keeps a map built once, so
    rewiring all its reads one value at a time is linear, not quadratic, in its width (``move_input`` keeps it)."""
    ins = n.inputs
    if len(ins) <= _WIDE:
        return [k for k, x in enumerate(ins) if x == name]
    pm = n.positions
    if pm is None:
        pm = n.positions = {}
        for k, x in enumerate(ins):
            pm.setdefault(x, []).append(k)
    return list(pm.get(name, ()))


def move_input(n: Node, k: int, old: str, new: str) -> None:
    """``n.inputs[k]`` went from ``old`` to ``new``: the wide node's map follows."""
    pm = n.positions
    if pm is not None:
        ks = pm[old]
        ks.remove(k)
        if not ks:
            del pm[old]
        insort(pm.setdefault(new, []), k)


# a value's explicit readers: the one node reading it once (the common case: no dict per value), or node -> reads
Uses = Node | dict[Node, int]


def add_use(uses: dict[str, Uses], name: str, node: Node) -> None:
    """One more read of ``name`` by ``node``."""
    d = uses.get(name)
    if d is None:
        uses[name] = node
    elif isinstance(d, dict):
        d[node] = d.get(node, 0) + 1
    else:
        uses[name] = {d: 2} if d is node else {d: 1, node: 1}


def drop_use(uses: dict[str, Uses], name: str, node: Node, every: bool = False) -> None:
    """One read of ``name`` by ``node`` fewer (``every``: all its reads of it)."""
    d = uses.get(name)
    if d is node:
        del uses[name]
    elif isinstance(d, dict) and node in d:
        if every or d[node] == 1:
            del d[node]
            if len(d) == 1:  # one reader left: back to the compact entry when it reads the value once
                (only, reads), = d.items()
                if reads == 1:
                    uses[name] = only
        else:
            d[node] -= 1


def readers(uses: dict[str, Uses], name: str) -> list[Node]:
    """The nodes reading ``name`` (each once, in the order they first read it)."""
    d = uses.get(name)
    return [] if d is None else list(d) if isinstance(d, dict) else [d]
