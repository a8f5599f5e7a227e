"""Apply graph passes to a whole model: main graph, If/Loop/Scan bodies (recursively) and model-local functions.

Types come from each graph's own value_info, inputs, outputs and initializers (the pipeline runs shape inference
first and records what it infers in each graph), resolved by lexical scope: a subgraph's view asks its enclosing
graph's view for names it does not define itself (``ir.GraphCtx.type_of``), so a body that reuses an outer name for
a value of another type, or two bodies that reuse one name, never see each other's types. Function bodies are
polymorphic: only types a function fixes itself (Cast ``to``, Constant) are known there, so type-dependent rules
fire less inside functions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from onnx import FunctionProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto

from ..core.graph import free_names, may_have_subgraphs, nested_indices, subgraphs
from .ir import GraphCtx, Scope


class GraphPass(Protocol):
    """What the walker needs of a pass (``base.GraphPass`` has it; that module imports this one)."""

    name: str

    def rewrite(self, ctx: GraphCtx) -> int: ...


_MAX_LOCAL_ROUNDS = 64


@dataclass
class WalkStats:
    rewrites: int = 0
    nested: bool = False  # a subgraph or function was visited (then one graph's fixed point is not the model's)
    rules: Counter[str] = field(default_factory=Counter)
    removed: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class _Walk:
    """One ``run_passes`` call's passes, statistics and settings, handed down to every graph it visits."""

    passes: Sequence[GraphPass]
    stats: WalkStats
    fixed_point: bool  # rounds until none rewrites (else one round)
    incremental: bool  # passes that opt in walk only what was touched since their last walk (``dirty``)


def default_opset(opsets: Sequence[OperatorSetIdProto], fallback: int = 1) -> int:
    """The default-domain opset version among ``opsets``; ``fallback`` when none is imported."""
    for o in opsets:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return fallback


def graph_types(graph: GraphProto, types: dict[str, int] | None = None) -> dict[str, int]:
    """Element types that ``graph`` itself declares (value_info, outputs, inputs, initializers), not its subgraphs'.

    Where two declarations of one name disagree, the later in that order wins, as in onnx's checker and inference:
    a graph input's or an initializer's own type is its value's type (a value_info entry naming it is not checked,
    so a valid model may carry a stale one), and a graph output's declaration is checked where its value_info is
    not."""
    types = {} if types is None else types
    for infos in (graph.value_info, graph.output, graph.input):
        for vi in infos:  # a non-tensor type reads as an unset tensor_type, whose elem_type is 0 (unknown)
            e = vi.type.tensor_type.elem_type
            if e:
                types[vi.name] = e
    for t in graph.initializer:
        types[t.name] = t.data_type
    return types


def training_state(model: ModelProto) -> set[str]:
    """The main graph's initializers that ``model.training_info`` reads or assigns (its algorithm's and
    initialization's free names, the keys of its bindings): training state, which a training step overwrites, so a
    rewrite must treat each like a graph input (kept, never folded as a constant)."""
    names: set[str] = set()
    for ti in model.training_info:
        for g in (ti.algorithm, ti.initialization):
            names |= free_names(g)
        names.update(b.key for b in (*ti.update_binding, *ti.initialization_binding))
    return names & {t.name for t in model.graph.initializer} if names else names


def _annotated(graph: GraphProto) -> list[str]:
    """The names ``graph.quantization_annotation`` speaks about (annotated tensors, their scale and zero-point
    tensors): protected like graph outputs (kept, under their names and types), so no annotation is left naming a
    value that fold removed, renamed or retyped."""
    return [n for a in graph.quantization_annotation
            for n in (a.tensor_name, *(e.value for e in a.quant_parameter_tensor_names)) if n]


def _run_graph(graph: GraphProto, walk: _Walk, scope: Scope, state: Sequence[str] = ()) -> None:
    ctx = GraphCtx(graph, graph.node, [*(i.name for i in graph.input), *state],
                   [*(o.name for o in graph.output), *_annotated(graph)], scope, initializers=list(graph.initializer))
    _apply(ctx, walk)
    if ctx.changed:
        ctx.commit(graph.node, last=not ctx.has_subgraphs)  # else a subgraph's view asks this one about its nodes
        if ctx.dropped_initializers:
            for k in range(len(graph.initializer) - 1, -1, -1):
                if graph.initializer[k].name in ctx.dropped_initializers:
                    del graph.initializer[k]
        graph.initializer.extend(t for t in ctx.new_initializers if t.name not in ctx.dropped_initializers)
        if ctx.retyped:
            keep = [v for v in graph.value_info if v.name not in ctx.retyped]
            del graph.value_info[:]
            graph.value_info.extend(keep)
    if ctx.has_subgraphs:  # folding makes no node with a subgraph (``replace_node`` makes Constants)
        nodes = graph.node
        _run_subgraphs([nodes[k] for k in nested_indices(graph)], ctx, walk)


def _run_subgraphs(nodes: Sequence[NodeProto], parent: GraphCtx, walk: _Walk) -> None:
    for n in nodes:
        if may_have_subgraphs(n):
            bodies = list(subgraphs(n))
            kept = parent.kept_reads | {t.name for g in bodies for t in g.initializer if parent._scope_of(t.name)}
            for g in bodies:
                walk.stats.nested = True
                _run_graph(g, walk, Scope(parent.opset, graph_types(g), parent, kept_reads=kept,
                                          may_add_initializers=parent.may_add_initializers))


def _apply(ctx: GraphCtx, walk: _Walk) -> None:
    """Rounds of every pass until a round rewrites nothing. A pass that found nothing, with no rewrite anywhere
    since, is skipped: it would walk the same graph and find nothing again (passes are deterministic functions of
    the view, which only rewrites change). So the last round, which proves the fixed point, walks the graph only
    with the passes that ran before the last rewrite, not with every pass once more. And a pass that opts in
    (``incremental``) walks, after its first walk, only the Casts a rewrite touched since its previous walk began
    (``dirty``): on a 100k-node graph the later rounds then look at a fraction of the Casts."""
    done = 0  # rewrites so far in this view
    found_nothing_at: dict[int, int] = {}  # pass index -> ``done`` when it last found nothing
    started: dict[int, int] = {}  # pass index -> ``ctx.clock`` of its last walk (``dirty``)
    passes, stats = walk.passes, walk.stats
    for _ in range(_MAX_LOCAL_ROUNDS if walk.fixed_point else 1):
        n = 0
        for k, p in enumerate(passes):
            if found_nothing_at.get(k) == done:
                continue
            ctx.clock += 1
            ctx.since = started.get(k, 0) if walk.incremental and getattr(p, "incremental", False) else 0
            started[k] = ctx.clock
            r = p.rewrite(ctx)
            if r:
                n += r
                done += r
                found_nothing_at.pop(k, None)
            else:
                found_nothing_at[k] = done
        stats.rewrites += n
        if n == 0:
            break
    ctx.since = 0
    stats.rules.update(ctx.rules)
    stats.removed.update(ctx.removed)
    ctx.rules.clear()
    ctx.removed.clear()


def run_passes(model: ModelProto, passes: Sequence[GraphPass], *, fixed_point: bool = True,
               types: dict[str, int] | None = None, infer: Callable[[], dict[str, int]] | None = None,
               incremental: bool = True) -> WalkStats:
    """Run ``passes`` over every graph and function of ``model`` in place (to a local fixed point per graph).

    ``types`` holds the main graph's own value types (kept and updated across calls by the pipeline); subgraphs read
    theirs from their own value_info. ``infer``: shape inference's types for the main graph, asked by its view only
    where the schema facts leave a value untyped that inference could type (``ir.Scope.infer``). ``incremental``:
    after a pass's first walk of a view, it walks only the Casts touched since (``dirty``; False: every walk is
    whole, the reference the incremental walks are tested against).
    """
    stats = WalkStats()
    walk = _Walk(passes, stats, fixed_point, incremental)
    opset = default_opset(model.opset_import)
    scope = Scope(opset, graph_types(model.graph) if types is None else types, infer=infer,
                  may_add_initializers=model.ir_version >= 4)
    _run_graph(model.graph, walk, scope, sorted(training_state(model)))
    for fn in model.functions:
        stats.nested = True
        fscope = Scope(default_opset(fn.opset_import, opset), {})
        ctx = GraphCtx(None, fn.node, list(fn.input), list(fn.output), fscope, is_function=True)
        _apply(ctx, walk)
        if ctx.changed:
            ctx.commit(fn.node)
            _tidy_function_value_info(fn, ctx.retyped)
        _run_subgraphs(fn.node, ctx, walk)
    return stats


def _tidy_function_value_info(fn: FunctionProto, retyped: set[str]) -> None:
    """Drop the entries of ``fn.value_info`` (IR >= 10) for values a pass retyped (``sink_cast``: a moved op now
    carries the Cast's input type) or removed. Kept, they would declare a wrong or a dangling type: ``onnx.inliner``
    copies them into the caller's graph, whose inference and onnxruntime then reject the model. The view never reads
    them (function bodies are typed from Cast and Constant alone), so dropping one loses no fact."""
    if not fn.value_info:
        return
    defined = set(fn.input) | {o for n in fn.node for o in n.output}
    keep = [v for v in fn.value_info if v.name in defined and v.name not in retyped]
    if len(keep) != len(fn.value_info):
        del fn.value_info[:]
        fn.value_info.extend(keep)
