"""A light, mutable view of one ONNX graph (or function body) that passes rewrite in linear time.

The view keeps a producer map and consumer maps (explicit inputs, and implicit uses by If/Loop/Scan bodies that
read a name from this scope), so every rule looks up its neighbours in O(1) and no pass scans the graph
quadratically. ``commit()`` writes the surviving nodes back into the protobuf.

Names are resolved by lexical scope, as ONNX defines them: a view knows the types of the values *its own* graph
defines (graph inputs, initializers, node outputs) and asks its enclosing view (``parent``) for any other name, so a
subgraph may capture an outer value, and may shadow an outer name with a local value of another type, at any depth.
A function body has no parent (it sees only its own inputs). Rewrites that make a node read a name taken from
another node (``reads_same``) or that rename reads inside subgraphs (``can_replace``) check that the name still
denotes the same value where it is read.

Invariants every mutation keeps: a graph output's name is never renamed or removed (``bypass`` renames the
*producer* of the replacement instead, and refuses when that would merge two graph outputs or touch a graph input,
an initializer or an outer-scope value); nodes stay in topological order (a replacement value is always defined
before the node it replaces).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from sys import intern

from onnx import AttributeProto, GraphProto, NodeProto, TensorProto

from ..core.graph import CONTROL_FLOW_OPS, free_names, rename_free, subgraphs
from .protos import constant_node_tensor, defined_names
from .type_facts import infer_local, needs_inference


@dataclass(eq=False, slots=True)
class Node:
    proto: NodeProto
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

    def attr(self, name: str) -> AttributeProto | None:
        for a in self.proto.attribute:
            if a.name == name:
                return a
        return None

    def int_attr(self, name: str) -> int | None:
        """An int attribute's value; None when absent or a function attribute reference (unknown here)."""
        a = self.attr(name)
        if a is None or a.ref_attr_name or a.type != AttributeProto.INT:
            return None
        return a.i

    @property
    def is_cast(self) -> bool:
        """A default-domain Cast with a known target type and a named input."""
        return self.to is not None and self.alive and bool(self.inputs) and bool(self.inputs[0])


_ALIVE = attrgetter("alive")


def make_node(p: NodeProto, free: frozenset[str]) -> Node:
    op, domain = intern(p.op_type), intern(p.domain)  # one string per op type, not one per node
    n = Node(p, op, domain, p.input[:], p.output[:], free)  # a slice is a plain list, made faster than list()
    n.onnx_op = onnx_op = domain == "" or domain == "ai.onnx"
    if op == "Cast" and onnx_op:
        n.to = n.int_attr("to")
    return n


@dataclass
class Scope:
    """What a view starts from: the default-domain opset, the element types known for the values this graph itself
    defines (from its value_info, inputs, outputs, initializers), and the view of the enclosing graph."""

    opset: int
    types: dict[str, int] = field(default_factory=dict)
    parent: GraphCtx | None = None
    # shape inference's element types for this graph, asked only when the schema facts leave a value untyped that
    # inference could type (``type_facts.needs_inference``); None: the caller ran it already, or there is none
    infer: Callable[[], dict[str, int]] | None = None
    may_add_initializers: bool = True  # False below IR 4, where every initializer must also be a graph input


class GraphCtx:
    """Mutable view of one graph. ``outputs`` are protected names (graph or function outputs)."""

    def __init__(self, graph: GraphProto | None, nodes: list[NodeProto], inputs: list[str], outputs: list[str],
                 scope: Scope, *, initializers: Sequence[TensorProto] = (), is_function: bool = False) -> None:
        self.graph = graph
        self.is_function = is_function
        self.opset = scope.opset
        self.inputs = set(inputs)
        self.outputs = list(outputs)
        self.output_set = set(outputs)
        self.initializers: dict[str, TensorProto] = {t.name: t for t in initializers}
        self.parent = scope.parent
        self.may_add_initializers = scope.may_add_initializers and not is_function and graph is not None
        self.types = scope.types  # this graph's own values only; other names resolve through ``parent``
        for t in initializers:
            self.types[t.name] = t.data_type
        self.nodes: list[Node] = []
        self.producer: dict[str, Node] = {}
        self.uses: dict[str, dict[Node, int]] = {}
        self.implicit: dict[str, dict[Node, int]] = {}
        self.rules: Counter[str] = Counter()
        self.removed: Counter[str] = Counter()
        self.new_initializers: list[TensorProto] = []
        self.retyped: set[str] = set()
        self.dropped_initializers: set[str] = set()
        self._casts: list[Node] | None = None
        # Nodes that lost a reader since dead-node elimination last swept (None: it never did, every node may be dead)
        self.maybe_dead: set[Node] | None = None
        self.pass_state: dict[str, object] = {}  # what a pass keeps between its calls on this view (it says why)
        self.changed = False
        self.untyped: list[Node] = []  # nodes left with an untyped output by ``_index``
        self.has_subgraphs = False  # a node of this graph carries a subgraph
        self._index(nodes)
        if scope.infer is not None and needs_inference(self):
            self.types.update(scope.infer())
            for n in self.untyped:  # facts that follow from the inferred ones (data movement, shared variables)
                infer_local(self, n)

    def _index(self, nodes: list[NodeProto]) -> None:
        """One ``Node`` per proto, the producer and consumer maps and local type facts: the view's one pass over the
        protos (each field is read off the proto once, and the maps are locals: this runs once per node)."""
        producer, uses, implicit, types, append = self.producer, self.uses, self.implicit, self.types, self.nodes.append
        untyped = self.untyped
        empty: frozenset[str] = frozenset()
        for k, p in enumerate(nodes):
            n = make_node(p, empty)
            n.index = k
            if n.op in CONTROL_FLOW_OPS or not n.onnx_op:  # ``may_have_subgraphs``, on the fields already read
                sub = list(subgraphs(p))
                if sub:
                    self.has_subgraphs = True
                    n.free = frozenset().union(*(free_names(g) for g in sub))
                    for i in n.free:
                        implicit.setdefault(i, {})[n] = 1
            append(n)
            outs = n.outputs
            typed = True
            for o in outs:
                if o:
                    producer[o] = n
                    if typed and o not in types:
                        typed = False
            for i in n.inputs:
                if i:
                    d = uses.get(i)
                    if d is None:
                        uses[i] = {n: 1}
                    else:
                        d[n] = d.get(n, 0) + 1
            if not typed:
                infer_local(self, n)
                if any(o and o not in types for o in outs):
                    untyped.append(n)

    # ----------------------------------------------------------------- types
    def defines(self, name: str) -> bool:
        """This graph itself defines ``name`` (graph input, initializer or node output): it shadows outer names."""
        return name in self.producer or name in self.inputs or name in self.initializers

    def _scope_of(self, name: str) -> GraphCtx | None:
        c: GraphCtx | None = self
        while c is not None and not c.defines(name):
            c = c.parent
        return c

    def type_of(self, name: str) -> int:
        """Element type of ``name`` as this graph sees it (lexical scope; UNDEFINED when unknown)."""
        if name in self.producer or name in self.inputs or name in self.initializers:  # the common, local case
            return self.types.get(name, TensorProto.UNDEFINED)
        c = self._scope_of(name)
        return TensorProto.UNDEFINED if c is None else c.types.get(name, TensorProto.UNDEFINED)

    def reads_same(self, name: str, via: str) -> bool:
        """``name``, read here, is the value that the producer of ``via`` (visible here) reads under that name: no
        graph between this one and the one holding that producer shadows ``name``."""
        c: GraphCtx | None = self
        while c is not None and via not in c.producer:
            if c.defines(name):
                return False
            c = c.parent
        return c is not None

    def can_replace(self, old: str, new: str) -> bool:
        """Reads of ``old`` may become reads of ``new``: no subgraph that reads ``old`` defines ``new`` itself (its
        reads would then capture its own local value instead)."""
        for n in self.implicit.get(old, ()):
            if n.subdefs is None:
                n.subdefs = frozenset().union(*(defined_names(g) for g in subgraphs(n.proto)))
            if new in n.subdefs:
                return False
        return True

    # ----------------------------------------------------------------- queries
    def source(self, name: str) -> Node | None:
        """The node producing ``name``, in this graph or (read-only) in an enclosing one."""
        c = self._scope_of(name)
        n = None if c is None else c.producer.get(name)
        return n if n is not None and n.alive else None

    def consumers(self, name: str) -> list[Node]:
        return list(self.uses.get(name, {}))

    def casts(self) -> Iterator[Node]:
        """Each node that ``Node.is_cast`` when the walk reaches it (lazy: earlier rewrites are seen). A Cast's input
        name is never emptied (rewrites only rename reads to other values), so only ``alive`` is read per visit."""
        if self._casts is None:
            self._casts = [n for n in self.nodes if n.to is not None and n.inputs and n.inputs[0]]
        else:  # a removed node never comes back (``replace_node`` makes a new one)
            self._casts = list(filter(_ALIVE, self._casts))
        return filter(_ALIVE, self._casts)

    def cast_pairs(self) -> Iterator[tuple[Node, Node]]:
        """``(outer, inner)``: each Cast whose input another Cast produces, in this graph or an enclosing one.

        Lazy like ``casts``: a pair is looked up when the walk reaches ``outer``, after earlier rewrites.
        """
        get = self.producer.get
        for outer in self.casts():  # a local producer shadows every outer one (a dead one fails ``is_cast``)
            inner = get(outer.inputs[0]) or self.source(outer.inputs[0])
            if inner is not None and inner.is_cast:
                yield outer, inner

    def num_uses(self, name: str) -> int:
        """Explicit reads + implicit reads by subgraphs + 1 if it is a protected output."""
        d = self.uses.get(name)
        e = self.implicit.get(name)
        return (sum(d.values()) if d else 0) + (len(e) if e else 0) + (name in self.output_set)

    def is_local_value(self, name: str) -> bool:
        """Produced by a node of this graph (not a graph input, initializer or outer-scope value)."""
        return name in self.producer and name not in self.inputs and name not in self.initializers

    def constant_tensor(self, name: str) -> TensorProto | None:
        """The value of a constant this graph defines: an initializer that is not also a graph input (those can be
        overridden at run time), or a Constant node's tensor. Not a tensor whose data is still on disk (a lazy
        load): its bytes are not here, and reading them relative to the working folder would be wrong."""
        if name in self.initializers and name not in self.inputs:
            t = self.initializers[name]
            return None if t.data_location == TensorProto.EXTERNAL else t
        n = self.producer.get(name)
        if n is None or n.op != "Constant" or not n.onnx_op:
            return None
        return constant_node_tensor(n.proto)

    # ----------------------------------------------------------------- mutations
    def set_input(self, node: Node, k: int, new: str) -> None:
        old = node.inputs[k]
        node.inputs[k] = new
        node.dirty = True
        self.changed = True
        d = self.uses.get(old)
        if d is not None and node in d:
            d[node] -= 1
            if d[node] == 0:
                del d[node]
        self._lost_reader(old)
        e = self.uses.setdefault(new, {})
        e[node] = e.get(node, 0) + 1

    def replace_uses(self, old: str, new: str) -> None:
        """Every read of ``old`` in this graph and its subgraphs now reads ``new``. ``old`` must not be an output."""
        assert old not in self.output_set, old
        for n in list(self.uses.get(old, {})):
            for k, name in enumerate(n.inputs):
                if name == old:
                    self.set_input(n, k, new)
        for n in list(self.implicit.pop(old, {})):
            for g in subgraphs(n.proto):
                rename_free(g, old, new)
            n.free = (n.free - {old}) | {new}
            self.implicit.setdefault(new, {})[n] = 1
            self.changed = True
        self._lost_reader(old)
        if old in self.types and new not in self.types:
            self.types[new] = self.types[old]

    def remove_node(self, node: Node) -> None:
        node.alive = False
        self.changed = True
        self.removed[node.op] += 1
        uses, producer, maybe_dead = self.uses, self.producer, self.maybe_dead
        for i in node.inputs:
            d = uses.get(i)
            if d is not None:
                d.pop(node, None)
            if maybe_dead is not None:  # ``_lost_reader`` inlined (every removal comes here)
                p = producer.get(i)
                if p is not None:
                    maybe_dead.add(p)
        for i in node.free:
            d = self.implicit.get(i)
            if d is not None:
                d.pop(node, None)
            self._lost_reader(i)
        for o in node.outputs:
            if producer.get(o) is node:
                del producer[o]

    def bypass(self, node: Node, src: str, rule: str) -> bool:
        """Remove single-output ``node`` whose output equals value ``src`` everywhere (same type and bits).

        When the output is protected (a graph output), it keeps its name: the producer of ``src`` is renamed to
        produce it instead. That is refused when ``src`` is itself an output (two outputs would become one value),
        a graph input (Identity between input and output), an initializer or an outer-scope value.
        """
        out = node.outputs[0]
        if out not in self.output_set:
            if not self.can_replace(out, src):
                return False
            self.remove_node(node)
            self.replace_uses(out, src)
        else:
            if src in self.output_set or not self.is_local_value(src) or not self.can_replace(src, out):
                return False
            prod = self.producer[src]
            self.remove_node(node)
            k = prod.outputs.index(src)
            prod.outputs[k] = out
            prod.dirty = True
            del self.producer[src]
            self.producer[out] = prod
            self.replace_uses(src, out)
        self.rules[rule] += 1
        return True

    def replace_node(self, node: Node, proto: NodeProto) -> Node:
        """Swap ``node`` for a new single node with the same outputs (e.g. Cast of a constant -> Constant)."""
        self.remove_node(node)
        new = make_node(proto, frozenset())
        if new.to is not None:
            self._casts = None  # a new Cast: the list of Casts is rebuilt, in node order, when next asked for
        new.index = idx = node.index
        self.nodes[idx] = new
        for o in new.outputs:
            self.producer[o] = new
        for i in new.inputs:
            d = self.uses.setdefault(i, {})
            d[new] = d.get(new, 0) + 1
        if self.maybe_dead is not None:
            self.maybe_dead.add(new)
        return new

    def _lost_reader(self, name: str) -> None:
        """``name`` has one reader fewer: its producer may be dead now (the next dead-node sweep looks at it)."""
        if self.maybe_dead is not None:
            p = self.producer.get(name)
            if p is not None:
                self.maybe_dead.add(p)

    def position(self, node: Node) -> int:
        """Index of ``node`` in the (topologically ordered) node list."""
        return node.index

    def add_initializer(self, tensor: TensorProto) -> None:
        self.new_initializers.append(tensor)
        self.initializers[tensor.name] = tensor
        self.types[tensor.name] = tensor.data_type
        self.changed = True

    def drop_initializer(self, name: str) -> None:
        self.initializers.pop(name, None)
        self.dropped_initializers.add(name)
        self.changed = True

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.alive]

    # ----------------------------------------------------------------- write back
    def commit(self) -> list[NodeProto]:
        """The surviving node protos, with rewritten inputs/outputs written back."""
        out: list[NodeProto] = []
        for n in self.nodes:
            if not n.alive:
                continue
            if n.dirty:
                del n.proto.input[:]
                n.proto.input.extend(n.inputs)
                del n.proto.output[:]
                n.proto.output.extend(n.outputs)
                n.dirty = False
            out.append(n.proto)
        return out
