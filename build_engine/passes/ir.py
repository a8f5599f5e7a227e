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

from onnx import GraphProto, NodeProto, TensorProto

from ..core.graph import CONTROL_FLOW_OPS, free_names, rename_free, subgraphs
from .commit import commit
from .dirty import touch, touch_input, touch_readers, touch_up
from .dtypes import DATA_MOVEMENT
from .node import ALIVE, Node, NodeList, Uses, add_use, drop_use, input_positions, make_node, move_input, readers
from .protos import constant_node_tensor, defined_names
from .type_facts import infer_local, needs_inference, type_outputs


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
    # names a sibling body shadows with an initializer: onnxruntime reads the enclosing value there only while some
    # body reads it, so no read of them is removed here (``walk._run_subgraphs``)
    kept_reads: frozenset[str] = frozenset()


class GraphCtx:
    """Mutable view of one graph. ``outputs`` are protected names (graph or function outputs)."""

    def __init__(self, graph: GraphProto | None, nodes: Sequence[NodeProto], inputs: list[str], outputs: list[str],
                 scope: Scope, *, initializers: Sequence[TensorProto] = (), is_function: bool = False) -> None:
        self.graph = graph
        self.is_function = is_function
        self.opset = scope.opset
        self.inputs = set(inputs)
        self.outputs = list(outputs)
        self.output_set = set(outputs)
        self.initializers: dict[str, TensorProto] = {t.name: t for t in initializers}
        # initializers named like an enclosing value: onnx.reference reads that value there, onnxruntime the
        # initializer or the value (whether a body of the node reads the value elsewhere): no constant, no type,
        # and (defined here) no read of the enclosing value made across them
        self.shadowed = {k for k in self.initializers if scope.parent is not None and scope.parent._scope_of(k)}
        self.parent = scope.parent
        self.may_add_initializers = scope.may_add_initializers and not is_function and graph is not None
        self.kept_reads = scope.kept_reads
        self.types = scope.types  # this graph's own values only; other names resolve through ``parent``
        for name, t in self.initializers.items():  # the dict's own name strings: one string object per name
            self.types[name] = t.data_type
        for name in self.shadowed:
            del self.types[name]
        self.nodes: list[Node] = []
        self.producer: dict[str, Node] = {}
        self.uses: dict[str, Uses] = {}
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
        # the walk's clock and the pass's start mark (``dirty``): ``casts`` yields only Casts touched at or after
        # ``since`` (0: every Cast)
        self.clock, self.since = 0, 0
        self.untyped: list[Node] = []  # nodes left with an untyped output by ``_index``
        self.has_subgraphs = False  # a node of this graph carries a subgraph
        self._index(nodes)
        if scope.infer is not None and needs_inference(self):
            self.types.update(scope.infer())
            for n in self.untyped:  # facts that follow from the inferred ones (data movement, shared variables)
                infer_local(self, n)

    def _index(self, nodes: Sequence[NodeProto]) -> None:
        """One ``Node`` per proto, the producer and consumer maps and local type facts: the view's one pass over the
        protos (each field is read off the proto once, and the maps are locals: this runs once per node).

        Memory (a graph of light nodes costs mostly this view): a node keeps no proto wrapper (it reads ``nodes[k]``
        when asked); each name read is the string object its producer's output (or the graph input) already holds,
        not a copy per read; a value read once by one node has that node, not a dict, as its ``uses`` entry."""
        producer, uses, implicit, types, append = self.producer, self.uses, self.implicit, self.types, self.nodes.append
        empty: frozenset[str] = frozenset()
        graph_inputs = {i: i for i in self.inputs}
        for k, p in enumerate(nodes):
            n = make_node(p, empty, nodes, k)
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
            ins = n.inputs
            for j, i in enumerate(ins):
                if i:
                    pr = producer.get(i)
                    if pr is not None:
                        for o in pr.outputs:
                            if o == i:
                                ins[j] = i = o
                                break
                    elif i in graph_inputs:
                        ins[j] = i = graph_inputs[i]
                    d = uses.get(i)
                    if d is None:  # ``add_use`` inlined
                        uses[i] = n
                    elif isinstance(d, dict):
                        d[n] = d.get(n, 0) + 1
                    else:
                        uses[i] = {d: 2} if d is n else {d: 1, n: 1}
            if not typed and type_outputs(self, n):
                self.untyped.append(n)

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
            if new in n.subdefs or old in n.subdefs:  # ``old``: read under a body initializer's name (free_names)
                return False
        return True

    # ----------------------------------------------------------------- queries
    def source(self, name: str) -> Node | None:
        """The node producing ``name``, in this graph or (read-only) in an enclosing one."""
        c = self._scope_of(name)
        n = None if c is None else c.producer.get(name)
        return n if n is not None and n.alive else None

    def consumers(self, name: str) -> list[Node]:
        return readers(self.uses, name)

    def casts(self) -> Iterator[Node]:
        """Each node that ``Node.is_cast`` when the walk reaches it (lazy: earlier rewrites are seen). A Cast's input
        name is never emptied (rewrites only rename reads to other values), so only ``alive`` is read per visit."""
        if self._casts is None:
            self._casts = [n for n in self.nodes if n.to is not None and n.inputs and n.inputs[0]]
        else:  # a removed node never comes back (``replace_node`` makes a new one)
            self._casts = list(filter(ALIVE, self._casts))
        since = self.since
        return filter(ALIVE, [n for n in self._casts if n.touched >= since] if since else self._casts)

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
        reads = 0 if d is None else sum(d.values()) if isinstance(d, dict) else 1
        return reads + (len(e) if e else 0) + (name in self.output_set)

    def is_local_value(self, name: str) -> bool:
        """Produced by a node of this graph (not a graph input, initializer or outer-scope value)."""
        return name in self.producer and name not in self.inputs and name not in self.initializers

    def constant_tensor(self, name: str) -> TensorProto | None:
        """The value of a constant this graph defines: an initializer that is not also a graph input (those can be
        overridden at run time), or a Constant node's tensor. Not a tensor whose data is still on disk (a lazy
        load, or a model read without its external data: an initializer or a Constant's value anywhere): its bytes
        are not here, and ``numpy_helper.to_array`` would read a file of that name in the working folder."""
        if name in self.initializers and name not in self.inputs:
            t = self.initializers[name]
            return None if t.data_location == TensorProto.EXTERNAL or name in self.shadowed else t
        n = self.producer.get(name)
        if n is None or n.op != "Constant" or not n.onnx_op:
            return None
        value = constant_node_tensor(n.proto)
        return None if value is None or value.data_location == TensorProto.EXTERNAL else value

    # ----------------------------------------------------------------- mutations
    def set_input(self, node: Node, k: int, new: str) -> None:
        old = node.inputs[k]
        node.inputs[k] = new
        move_input(node, k, old, new)
        node.dirty = True
        self.changed = True
        drop_use(self.uses, old, node)
        self._lost_reader(old)
        add_use(self.uses, new, node)
        touch_input(self, node, new)

    def replace_uses(self, old: str, new: str) -> None:
        """Every read of ``old`` in this graph and its subgraphs now reads ``new``. ``old`` must not be an output."""
        assert old not in self.output_set, old
        for n in readers(self.uses, old):
            for k in input_positions(n, old):
                self.set_input(n, k, new)
        for n in list(self.implicit.pop(old, {})):
            for g in subgraphs(n.proto):
                rename_free(g, old, new)
            n.free = (n.free - {old}) | {new}
            self.implicit.setdefault(new, {})[n] = 1
            self.changed = True
        self._lost_reader(old)
        if old in self.types and new not in self.types:
            self.set_type(new, self.types[old])

    def remove_node(self, node: Node) -> None:
        node.alive = False
        self.changed = True
        self.removed[node.op] += 1
        uses, producer, maybe_dead = self.uses, self.producer, self.maybe_dead
        for i in node.inputs:
            drop_use(uses, i, node, every=True)
            p = producer.get(i)  # ``_lost_reader`` inlined (every removal comes here)
            if p is not None:
                if maybe_dead is not None:
                    maybe_dead.add(p)
                p.touched = self.clock  # ``dirty.touch_up`` inlined for a producer that is not data movement
                if p.op in DATA_MOVEMENT:
                    touch_up(self, p)
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
            touch(self, prod)
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
            add_use(self.uses, i, new)
        if self.maybe_dead is not None:
            self.maybe_dead.add(new)
        touch(self, new)
        return new

    def set_type(self, name: str, t: int, *, retyped: bool = False) -> None:
        """``name``'s element type is ``t`` now (``retyped``: it had another, which its value_info may declare)."""
        self.types[name] = t
        if retyped:
            self.retyped.add(name)
        touch_readers(self, name)

    def _lost_reader(self, name: str) -> None:
        """``name`` has one reader fewer: its producer may be dead now (the next dead-node sweep looks at it)."""
        p = self.producer.get(name)
        if self.maybe_dead is not None and p is not None:
            self.maybe_dead.add(p)
        touch_up(self, p)

    def position(self, node: Node) -> int:
        """Index of ``node`` in the (topologically ordered) node list."""
        return node.index

    def add_initializer(self, tensor: TensorProto) -> None:
        self.new_initializers.append(tensor)
        self.initializers[tensor.name] = tensor
        self.types[tensor.name] = tensor.data_type
        self.changed = True
        touch_readers(self, tensor.name)

    def drop_initializer(self, name: str) -> None:
        self.initializers.pop(name, None)
        self.dropped_initializers.add(name)
        self.changed = True

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.alive]

    # ----------------------------------------------------------------- write back
    def commit(self, container: NodeList, *, last: bool = False) -> None:
        """Write the result into ``container``, the node list this view was built from (``commit.commit``)."""
        commit(self, container, last=last)

    def drop_cast_list(self) -> None:
        """Forget the list of Casts (``casts`` rebuilds it, in node order, when next asked for)."""
        self._casts = None
