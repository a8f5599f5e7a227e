"""The exact-folding pipeline: every pass, to a fixed point, then validation (``fold`` is the public entry).

``fold(model)`` copies the model, learns element types (on a model without subgraphs or functions from the ops'
schemas as the pass view is built, with onnx's non-strict shape inference only where those leave a value untyped
that inference could type, ``passes/type_facts.py``; otherwise shape inference first, as for nested graphs), runs the
passes over the main graph, If/Loop/Scan bodies and model-local functions until none fires, drops value_info of
values that no longer exist, and re-runs ``onnx.checker`` and shape inference on the result. Graph input and output
names are always kept. The cost is linear in the graph size: every pass walks the node list once per round with
O(1) producer/consumer look-ups (``ir.GraphCtx``), the rounds are few (a round trip exposed by one rule is
usually taken by a later rule in the same round), and after the first round most passes walk only the Casts a
rewrite touched since their previous walk (``dirty``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx
from onnx import GraphProto, ModelProto

from ..core import onnx_skeleton, steps
from ..core.errors import CheckFailed
from ..core.graph import PROTO_LIMIT, nested_indices, subgraphs
from ..core.heap import release_free_heap
from ..core.shape_inference import infer_shapes
from .base import GraphPass, PassResult
from .census import census, op_histogram
from .report import FoldReport
from .walk import WalkStats, graph_types, run_passes

_MAX_ROUNDS = 16
# a graph this big gets one full garbage collection between the passes and validation: the memory the freed pass view
# held goes back before onnx's C++ checker and strict inference allocate theirs (peak RSS growth at 100k nodes 127 ->
# 97 MB), at a cost (~20 ms in a CLI process) that smaller graphs would not repay
_COLLECT_BEFORE_VALIDATION = 10_000


def default_passes() -> tuple[GraphPass, ...]:
    """Every exact rule, cheapest first; dead-node elimination last (it cleans what the others orphan)."""
    from .cast_chain import CollapseCastChain
    from .cast_like import CastLikeToCast
    from .cast_round_trip import CollapseCastRoundTrip
    from .const_cast import FoldConstantCast
    from .const_expr import FoldConstantExpression
    from .dead_nodes import RemoveDeadNodes
    from .dedup_cast import MergeDuplicateCasts
    from .gather_index_cast import GatherIndexCast
    from .identity import RemoveIdentity
    from .same_cast import RemoveSameTypeCast
    from .shape_of_cast import ShapeOfCast
    from .sink_cast import SinkCastThroughDataMovement

    return (CastLikeToCast(), RemoveIdentity(), RemoveSameTypeCast(), CollapseCastRoundTrip(), CollapseCastChain(),
            FoldConstantExpression(), FoldConstantCast(), ShapeOfCast(), GatherIndexCast(), MergeDuplicateCasts(),
            SinkCastThroughDataMovement(), RemoveDeadNodes())


class Pipeline:
    """Runs passes over a model (in place) until a whole round changes nothing."""

    name = "fold_pipeline"

    def __init__(self, passes: Sequence[GraphPass] | None = None, max_rounds: int = _MAX_ROUNDS,
                 incremental: bool = True) -> None:
        self.passes = tuple(passes) if passes is not None else default_passes()
        self.max_rounds = max_rounds
        self.incremental = incremental  # ``walk.run_passes``'s
        self.stats = WalkStats()

    def call(self, model: ModelProto, types: dict[str, int] | None = None,
             infer: Callable[[], dict[str, int]] | None = None) -> PassResult:
        """``infer``: ``walk.run_passes``'s, for the first round (the model is still the input then)."""
        self.stats = WalkStats()
        if types is None:
            types = graph_types(model.graph)
        for _ in range(self.max_rounds):
            s = run_passes(model, self.passes, types=types, infer=infer, incremental=self.incremental)
            infer = None
            self.stats.rewrites += s.rewrites
            self.stats.rules.update(s.rules)
            self.stats.removed.update(s.removed)
            if s.rewrites == 0 or not s.nested:  # one flat graph at its local fixed point: done
                break
        return PassResult(model, self.stats.rewrites > 0)


@dataclass(frozen=True)
class FoldResult:
    model: ModelProto
    report: FoldReport


_INFERRED = "trtforge:fold:inferred"  # doc_string of the value_info entries fold adds to subgraphs (then removes)


def _infer_types(model: ModelProto) -> dict[str, int]:
    """The main graph's own value types; the types inferred for each subgraph's values are recorded in that
    subgraph's value_info (marked, removed by ``_tidy_value_info``), so every graph keeps its own name -> type table.
    Inference runs on the weight-free skeleton: a weight's type is its stand-in input's type, and no element type
    depends on a weight's values."""
    types = graph_types(model.graph)
    try:
        inferred = infer_shapes(model)
    except Exception:  # inference is only a source of type facts; without it (too big, invalid) fewer rules fire
        return types
    types.update(graph_types(inferred.graph))
    _annotate_subgraphs(model.graph, inferred.graph)
    del inferred
    release_free_heap()  # what the C++ inference and its parsed result freed, before the pass view is built
    return types


def _annotate_subgraphs(graph: GraphProto, inferred: GraphProto) -> None:
    """Copy inferred element types into the value_info of each subgraph of ``graph`` (same structure as
    ``inferred``, which shape inference produced from a copy), at every depth."""
    if len(graph.node) != len(inferred.node):
        return
    for k in nested_indices(graph):
        n, m = graph.node[k], inferred.node[k]
        for g, gi in zip(subgraphs(n), subgraphs(m), strict=False):
            known = set(graph_types(g))
            for name, t in graph_types(gi).items():
                if name not in known:
                    vi = onnx.helper.make_tensor_value_info(name, t, None)
                    vi.doc_string = _INFERRED
                    g.value_info.append(vi)
            _annotate_subgraphs(g, gi)


def _tidy_value_info(graph: GraphProto, flat: bool = False) -> None:
    """In ``graph`` and every graph nested in it (``flat``: there is none): drop the value_info entries
    ``_annotate_subgraphs`` added, then those of values that no longer exist (each graph's own entries only, so one
    walk does both)."""
    for k in () if flat else nested_indices(graph):
        for g in subgraphs(graph.node[k]):
            _tidy_value_info(g)
    if not graph.value_info:
        return
    if any(v.doc_string == _INFERRED for v in graph.value_info):
        keep = [v for v in graph.value_info if v.doc_string != _INFERRED]
        del graph.value_info[:]
        graph.value_info.extend(keep)
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for n in graph.node:
        defined.update(n.output)
    if any(v.name not in defined for v in graph.value_info):
        keep = [v for v in graph.value_info if v.name in defined]
        del graph.value_info[:]
        graph.value_info.extend(keep)


def _validate(result: ModelProto, original: ModelProto | bytes) -> None:
    """Checker and strict shape inference on the result; a failure the original also has is not ours.

    Both run without serialising the weights (``onnx_skeleton.check_model`` checks the skeleton plus each weight tensor;
    inference needs only the skeleton). Folding never changes a graph input's declaration nor an existing weight, so
    what the skeleton leaves out (a declared input disagreeing with its initializer) cannot be a folding bug.
    """
    try:  # the skeleton serialised once: the checker and strict inference both read these bytes
        data = onnx_skeleton.skeleton_bytes(result, for_checker=True)
    except ValueError:
        return
    if len(data) >= PROTO_LIMIT:
        return
    checks = (("onnx.checker", lambda: _check_result(result, data), onnx_skeleton.check_model),
              ("shape inference", lambda: _strict_inference(data),
               lambda m: infer_shapes(m, check_type=True, strict=True)))
    for what, on_result, on_model in checks:
        try:
            on_result()
        except Exception as exc:
            try:
                on_model(original if isinstance(original, ModelProto) else ModelProto.FromString(original))
            except Exception:
                continue  # the input already fails this check: folding did not cause it
            first = (str(exc).strip().splitlines() or ["invalid"])[0]
            raise CheckFailed(f"fold produced a model that {what} rejects ({first}); this is a trtforge bug, "
                              "please report it with the input model") from exc


def _check_result(result: ModelProto, skeleton_bytes: bytes) -> None:
    """``onnx_skeleton.check_model(result)``, with the skeleton already serialised."""
    if result.ir_version < 4:
        onnx_skeleton.check_model(result)
        return
    onnx.checker.check_model(skeleton_bytes)
    onnx_skeleton.check_weights(result)


def _strict_inference(skeleton_bytes: bytes) -> None:
    """Strict shape inference with type checks; the inferred model is not parsed back (only failures matter)."""
    try:
        onnx.shape_inference.C.infer_shapes(skeleton_bytes, True, True, False)
    finally:
        release_free_heap()  # the C heap inference freed (~1 kB per node) is not kept by the process


def _original_skeleton(model: ModelProto) -> ModelProto | bytes:
    """The input without its weights, for ``_validate`` (read only when the result fails a check): its serialised
    bytes (cheaper than a copy of the graph), or a copy when even the skeleton is too big to serialise."""
    try:
        return onnx_skeleton.skeleton_bytes(model)
    except ValueError:
        return onnx_skeleton.skeleton(model)


@steps.timed("fold")
def fold(model: ModelProto, *, passes: Sequence[GraphPass] | None = None, validate: bool = True,
         inplace: bool = False) -> FoldResult:
    """Exact Cast/Identity folding (rules: ``passes/__init__.py``).
    Returns a new model; ``model`` is not mutated unless
    ``inplace``: then ``model`` itself is folded and returned (no copy of the weights, for callers that do not use
    the input again)."""
    t0 = time.perf_counter()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the pass view allocates ~10 small objects per node; cyclic GC would make that superlinear
    try:
        return _fold(model, passes, validate, t0, inplace)
    finally:
        if gc_was_enabled:
            gc.enable()


def _fold(model: ModelProto, passes: Sequence[GraphPass] | None, validate: bool, t0: float,
          inplace: bool) -> FoldResult:
    if inplace:
        work, original = model, _original_skeleton(model)
    else:
        work, original = ModelProto(), model
        work.CopyFrom(model)
    before, flat = census(work)
    pipeline = Pipeline(passes)
    if flat:  # folding adds no subgraph and no function: the result is flat too
        # shape inference runs only if the view asks (``type_facts.needs_inference``): on such a model the schema
        # facts usually type every value, and inference of a 100k-node graph costs more than all the rules together
        pipeline.call(work, graph_types(work.graph), lambda: _infer_types(work))
    else:  # subgraphs get their inferred types in their value_info
        pipeline.call(work, _infer_types(work))
    _tidy_value_info(work.graph, flat)
    if validate:
        if len(work.graph.node) >= _COLLECT_BEFORE_VALIDATION:
            gc.collect()  # measured at 100k nodes: the pass view's ~75 MB back to the OS, for ~20 ms (module doc)
        _validate(work, original)
    after = op_histogram(work, flat)
    removed = {op: before[op] - after.get(op, 0) for op in sorted(before) if before[op] > after.get(op, 0)}
    added = {op: after[op] - before.get(op, 0) for op in sorted(after) if after[op] > before.get(op, 0)}
    report = FoldReport(nodes_before=sum(before.values()), nodes_after=sum(after.values()), removed=removed,
                        added=added, rules=dict(sorted(pipeline.stats.rules.items())),
                        seconds=round(time.perf_counter() - t0, 6))
    return FoldResult(work, report)
