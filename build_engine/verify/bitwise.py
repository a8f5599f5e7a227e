"""Prove two models compute the same outputs, bit for bit, on fresh random inputs (``trtforge fold --check``).

Which runtime judges: ``onnx.reference.ReferenceEvaluator`` wherever it runs the original model (it defines the
semantics exactness is judged by); otherwise onnxruntime's CPU provider with every graph optimization off, one
thread and no weight pre-packing (``sessions.make_session``: it then evaluates the graph as written); if neither
runs it, ``CannotCheck`` (exit 2: "could not check this model: reason (op X)"). Inputs: typical values (the shared
planner ``inputs.random_feeds``) and every value class of each dtype (``fold_feeds``), with Loop bodies run and If
conditions tried both ways; a graph input with a default initializer gets every value class in one more draw.
Not run (``CannotCheck`` before anything runs): a model with a graph input that is not a tensor or that has more
than ``inputs.MAX_SHAPE_ELEMENTS`` elements, or with a Loop whose constant trip count exceeds ``MAX_LOOP_TRIPS``.
A trip count computed from the inputs is capped at ``MAX_LOOP_TRIPS`` in both models (at every opset), and a Loop
bounded only by its condition gets that cap as its trip count (``while v < lim: v *= 2`` never ends for the value
class v = 0.0, and such a Loop hung the check).
Both models run on the same inputs in the same runtime,
compared by ``compare.compare_arrays``: NaN equals NaN (payloads are not part of ONNX semantics); everything else
must match bitwise, including the sign of zero. A difference counts only when the original, run again on the same
inputs, repeats its own outputs; when it does not (a random op without a seed), ``CannotCheck``: no comparison of
two runs can judge the fold.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto

from ..core import steps
from ..core.errors import InputError
from ..core.graph import all_graphs, model_nodes, subgraphs
from . import fold_feeds
from .compare import compare_arrays
from .fold_feeds import control_pins, extreme_inputs, inline_functions, pinned, sizing_inputs, value_class_parts
from .inputs import MAX_SHAPE_ELEMENTS, draw_feeds, graph_inputs, plan_feeds
from .loops import MAX_LOOP_TRIPS, runnable_loops
from .reference import evaluator_class
from .sessions import make_session

_LOW_PRECISION = {TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                  TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    max_abs_diff: float
    runtime: str
    mismatched: tuple[str, ...] = ()
    runs: int = 0  # input draws both models ran on

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "max_abs_diff": self.max_abs_diff, "runtime": self.runtime,
                "mismatched_outputs": list(self.mismatched), "runs": self.runs}


def uses_low_precision(model: ModelProto) -> bool:
    """Whether any tensor of the model (value, initializer, Cast target) is fp16, bf16 or float8, in the main
    graph, its subgraphs or a model-local function body."""
    for g in all_graphs(model.graph):
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.tensor_type.elem_type in _LOW_PRECISION:
                return True
        if any(t.data_type in _LOW_PRECISION for t in g.initializer):
            return True
    for n in model_nodes(model):
        for a in n.attribute:
            if (a.name == "to" and a.i in _LOW_PRECISION) or (a.HasField("t") and a.t.data_type in _LOW_PRECISION):
                return True
    return False


def _as_value(o: Any) -> Any:
    """One output as the check compares it: an array per tensor, a list per sequence, a dict per map, None for an
    empty optional (a sequence of tensors of different shapes is no array, and a map no array of numbers)."""
    if o is None:
        return None
    if isinstance(o, dict):
        return {k: _as_value(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_as_value(v) for v in o]
    return np.asarray(o)


def compare_values(a: Any, b: Any) -> tuple[bool, float]:
    """(bit-identical, max |diff| over what differs) of two outputs (``_as_value``): tensors by ``compare_arrays``,
    sequences element by element (same length), maps key by key (same keys), an empty optional equal only to one;
    anything else is a difference of inf."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        d = compare_arrays(a, b)
        return d.bitwise, d.max_abs_unequal
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = list(zip(a, b, strict=True))
    elif isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        pairs = [(a[k], b[k]) for k in a]
    else:
        return (a is None and b is None), (0.0 if a is None and b is None else float("inf"))
    results = [compare_values(x, y) for x, y in pairs]
    return all(ok for ok, _ in results), max((d for _, d in results), default=0.0)


def run_model(model: ModelProto, feeds: Mapping[str, np.ndarray], runtime: str,
              path: str | None = None) -> list[Any]:
    """Every output of ``model`` on ``feeds`` (``_as_value``): ``onnx.reference``, or a deterministic onnxruntime
    session (``sessions.make_session``: no graph rewrites, no weight pre-packing, one thread). ``path``: the same
    model's file, which onnxruntime then loads itself (with its external data), so a model over protobuf's 2 GiB
    limit is never serialised in memory."""
    if runtime == "onnx.reference":  # with GatherElements held to its spec (``reference``: no endless index wrap)
        return [_as_value(o) for o in evaluator_class()(runnable_loops(model)).run(None, dict(feeds))]
    session = make_session(path if path is not None else runnable_loops(model))
    return [_as_value(o) for o in session.run(None, dict(feeds))]


class CannotCheck(InputError):
    """Neither runtime can run the original model: no verdict (exit 2), with the reason and the op at fault."""


def _culprit(model: ModelProto, exc: BaseException) -> str:
    """The op a runtime's error names (an op type of the model its message mentions, else the onnx.reference
    kernel the error was raised in: ``SequenceAt``'s 'list index out of range' names no op), for the one-line
    reason."""
    message = str(exc)
    ops = sorted({n.op_type for g in all_graphs(model.graph) for n in g.node} | {n.op_type for f in model.functions
                                                                                 for n in f.node}, key=len)
    named = [op for op in reversed(ops) if re.search(rf"\b{re.escape(op)}\b", message)]
    if named:
        return f"op {named[0]}"
    from onnx.reference.op_run import OpRun

    tb, kernel = exc.__traceback__, None
    while tb is not None:  # the innermost kernel: a function's node rather than the function call
        me = tb.tb_frame.f_locals.get("self")
        if isinstance(me, OpRun) and getattr(me, "onnx_node", None) is not None:
            kernel = me.onnx_node.op_type
        tb = tb.tb_next
    return f"op {kernel}" if kernel else "op unknown"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _pick_runtime(original: ModelProto, feeds: Mapping[str, np.ndarray], preferred: str | None,
                  path: str | None = None) -> str:
    """onnx.reference where it runs the original (it defines exactness); else onnxruntime with every graph
    optimization off, one thread, no pre-packing (same semantics: it evaluates the graph as written, and both models
    run in it); else ``CannotCheck``."""
    order = [preferred] if preferred else ["onnx.reference", "onnxruntime"]
    if not preferred and _calls_overloads(original):
        order = ["onnxruntime"]  # onnx.reference ignores NodeProto.overload: every call ran the last overload read
    errors = []
    for runtime in order:
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run_model(original, feeds, runtime, path)
            return runtime
        except Exception as exc:  # a runtime that cannot run a model is not a verdict on the fold
            errors.append((runtime, exc))
    last_runtime, last = errors[-1]
    first = errors[0]
    on = ", ".join(f"{n} {list(a.shape)}" for n, a in list(feeds.items())[:4]) + (", ..." if len(feeds) > 4 else "")
    raise CannotCheck(f"could not check this model: {first[0]} cannot run it on inputs {on or 'none'} "
                      f"({_first_line(first[1])}; "
                      f"{_culprit(original, first[1])})" + (
                          f", nor can {last_runtime} ({_first_line(last)}; {_culprit(original, last)})"
                          if len(errors) > 1 else "") + "; fold without --check, or check with another tool") from last


def _calls_overloads(model: ModelProto) -> bool:
    """Whether a node of the model (its graph, a subgraph or a function body) calls a function overload (IR 10:
    ``NodeProto.overload``), which onnx.reference 1.x does not tell apart: it runs one overload for every call, so
    a correct fold of such a model was judged 'OUTPUTS DIFFER'."""
    return any(n.overload for n in model_nodes(model))


def _trials(original: ModelProto, seed: int, trials: int,
            sizes: Mapping[str, tuple[int, ...]] | None = None) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Typical feeds, then every value class; each with Loop bodies running and each If condition both ways. A graph
    input with an initializer (IR >= 4: a default the caller may override) keeps its default in those draws and gets
    every value class in one more draw, so a fold that took such a default for a constant is seen too. An input that
    decides a tensor's size (``fold_feeds.sizing_inputs``) keeps its typical values. ``sizes``: input shapes instead
    of the planned ones (``_runtime_and_plan``)."""
    pins, branch_inputs = control_pins(original)
    sizing = sizing_inputs(original)  # typical values only: a value class there allocates gigabytes
    inits = {t.name: list(t.dims) for t in original.graph.initializer}
    defaults = {vi.name: inits[vi.name] for vi in original.graph.input if vi.name in inits and vi.name not in sizing}
    out = []
    for k in range(trials):
        typical = fold_feeds.sizing_typical(draw_feeds(plan_feeds(original, sizes), seed + k), sizing)
        shapes = {n: list(a.shape) for n, a in typical.items()}
        extreme = {**extreme_inputs(original, shapes, seed + k, k), **{n: typical[n] for n in sizing if n in typical}}
        # integers of every class often index out of range (token ids): also a draw with typical integers
        floats_only = {n: (a if a.dtype.kind in "iu" else extreme.get(n, a)) for n, a in typical.items()}
        draws = [("typical", typical), ("value classes", extreme), ("value classes", floats_only)]
        if defaults:
            draws.append(("value classes", {**typical, **extreme_inputs(original, defaults, seed + k, k)}))
        # inputs with fewer elements than value classes: the windows of the classes draws k < trials did not give
        free = {n: s for n, s in shapes.items() if n not in sizing}
        parts = value_class_parts(original, free) if k == trials - 1 else 0
        draws += [("value classes", {**extreme_inputs(original, shapes, seed + p, p),
                                     **{n: typical[n] for n in sizing if n in typical}}) for p in range(trials, parts)]
        for kind, feeds in draws:
            for flag in ((True, False) if branch_inputs else (True,)):
                out.append((kind, pinned(feeds, pins, branch_inputs, flag)))
    return out


def _runtime_and_plan(original: ModelProto, seed: int, trials: int, preferred: str | None,
                      path: str | None) -> tuple[str, list[tuple[str, dict[str, np.ndarray]]]]:
    """The judge (``_pick_runtime``) and the draws (``_trials``). When no runtime runs the original on the planned
    sizes of its dynamic dims (2 first, 4 after), every dynamic dim is tried at 1 (what broadcasts against any
    size: ``Add(x[N], b[4])`` runs only for N in {1, 4}); the first refusal is the one reported."""
    plan = _trials(original, seed, trials)
    try:
        return _pick_runtime(original, plan[0][1], preferred, path), plan
    except CannotCheck as first:
        dims = {vi.name: vi.type.tensor_type.shape.dim for vi in graph_inputs(original)}
        ones = {name: tuple(d.dim_value if d.HasField("dim_value") else 1 for d in ds)
                for name, ds in dims.items() if not all(d.HasField("dim_value") for d in ds)}
        if not ones:
            raise
        plan = _trials(original, seed, trials, ones)
        try:
            return _pick_runtime(original, plan[0][1], preferred, path), plan
        except CannotCheck:
            raise first from None


#: A Loop whose trip count is a constant above this is not run by ``--check`` (onnx.reference interprets every
#: iteration in Python: a model-defined 10**12 would never finish); its trip count is the model's, not an input.


def _constant_trip_count(graph: Any, name: str) -> int | None:
    """The value of ``name`` when ``graph`` defines it as a constant for the check: an initializer (also one that is
    a graph input's default: the check's feeds leave those at their defaults), or a Constant node's tensor; None
    otherwise."""
    from onnx import numpy_helper

    for t in graph.initializer:
        if t.name == name:
            return int(numpy_helper.to_array(t).reshape(-1)[0]) if t.data_location != TensorProto.EXTERNAL else None
    from ..passes.protos import constant_node_tensor

    for n in graph.node:
        if n.op_type == "Constant" and name in n.output:  # value, value_int(s), ... (not a function attr reference)
            t = constant_node_tensor(n)
            return None if t is None else int(numpy_helper.to_array(t).reshape(-1)[0])
    return None


def _check_runnable(model: ModelProto) -> None:
    """``CannotCheck`` before anything runs, for models no check can run: a graph input that is not a tensor (the
    feeds are tensors) or whose static shape has more than ``inputs.MAX_SHAPE_ELEMENTS`` elements (its feeds would
    not fit in memory: a MemoryError, exit 3), or a Loop whose constant trip count exceeds ``MAX_LOOP_TRIPS`` (it
    would not finish)."""
    for vi in model.graph.input:
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            what = {"sequence_type": "a sequence", "optional_type": "an optional", "map_type": "a map",
                    "sparse_tensor_type": "a sparse tensor"}.get(kind or "", "not typed")
            raise CannotCheck(f"could not check this model: graph input {vi.name!r} is {what}, not a tensor "
                              "(--check feeds tensors only); fold without --check")
    for spec in plan_feeds(model):
        if math.prod(spec.shape) > MAX_SHAPE_ELEMENTS:  # the check would hold several such feeds in memory
            raise CannotCheck(f"could not check this model: graph input {spec.name!r} has static shape "
                              f"{list(spec.shape)} ({math.prod(spec.shape)} elements, more than the "
                              f"{MAX_SHAPE_ELEMENTS} --check draws per input); fold without --check")
    for trips in _constant_trip_counts(inline_functions(model).graph, []):
        if trips > MAX_LOOP_TRIPS:
            raise CannotCheck(f"could not check this model: a Loop's constant trip count is {trips} (more "
                              f"than {MAX_LOOP_TRIPS} iterations are not run; op Loop); fold without --check")


def _constant_trip_counts(graph: Any, outer: list[Any]) -> Iterator[int]:
    """The constant trip count of each Loop in ``graph`` and the graphs nested in it, its name resolved lexically (a
    body's Loop may count to a constant of an enclosing graph)."""
    scopes = [*outer, graph]
    for n in graph.node:
        if n.op_type == "Loop" and n.input and n.input[0]:
            home = next((g for g in reversed(scopes) if n.input[0] in {*(i.name for i in g.input),
                         *(t.name for t in g.initializer), *(o for m in g.node for o in m.output)}), None)
            trips = None if home is None else _constant_trip_count(home, n.input[0])
            if trips is not None:
                yield trips
        for sub in subgraphs(n):
            yield from _constant_trip_counts(sub, scopes)


@steps.timed("check")
def check_equivalent(original: ModelProto, folded: ModelProto, seed: int = 0,
                     runtime: str | None = None, trials: int = 2,
                     paths: tuple[str, str] | None = None) -> CheckResult:
    """Run both models on the same inputs (typical values and every value class of each dtype, ``trials`` draws
    each, control flow exercised) and compare every output bitwise. A draw the original model itself cannot run
    (value-class ids out of an index range, ...) is skipped; if no draw runs, or no runtime runs the model,
    ``CannotCheck`` says why. ``paths``: the two models' files (original, folded), which onnxruntime then runs by
    path (``run_model``); ``original`` and ``folded`` may then be weight-free views (``onnx_skeleton.weightless``)."""
    path_a, path_b = paths if paths is not None else (None, None)
    _check_runnable(original)
    runtime, plan = _runtime_and_plan(original, seed, trials, runtime, path_a)
    names = [o.name for o in original.graph.output]
    passed, worst, bad, ran = True, 0.0, [], 0
    refused: Exception | None = None
    for _kind, feeds in plan:
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outs_a = run_model(original, feeds, runtime, path_a)
        except Exception as exc:
            # the original rejects these values (an index out of range: in a typical draw too, for a SequenceAt
            # position the planner does not bound): nothing to compare; the runtime ran the first draw
            refused = refused or exc
            continue
        ran += 1
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outs_b = run_model(folded, feeds, runtime, path_b)
        except Exception:  # the original ran and the folded model does not: that is a difference
            passed = False
            bad.extend(names)
            worst = float("inf")
            continue
        results = [compare_values(a, b) for a, b in zip(outs_a, outs_b, strict=True)]
        if not all(ok for ok, _ in results):
            _reproducible(original, feeds, runtime, path_a, outs_a)
        for name, (ok, diff) in zip(names, results, strict=True):
            if not ok:
                passed = False
                bad.append(name)
            worst = max(worst, diff)
    if not ran and refused is not None:
        raise CannotCheck(f"could not check this model: {runtime} fails on every input draw "
                          f"({_first_line(refused)}; {_culprit(original, refused)})") from refused
    return CheckResult(passed, worst, runtime, tuple(dict.fromkeys(bad)), ran)


#: Ops that draw random values (Dropout: in training mode); without a ``seed`` two runs of one model differ.
_RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
               "Dropout")


def _reproducible(original: ModelProto, feeds: Mapping[str, np.ndarray], runtime: str, path: str | None,
                  outs: Sequence[Any]) -> None:
    """Before a difference counts against the fold: the original, run again on the same ``feeds``, gives ``outs``
    again; else ``CannotCheck`` (no verdict: a random op without a seed makes every run differ, so a fold that
    changed nothing would fail the check), naming the random op the model holds."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = run_model(original, feeds, runtime, path)
    if all(compare_values(a, b)[0] for a, b in zip(outs, again, strict=True)):
        return
    ops = sorted({n.op_type for n in model_nodes(original) if n.op_type in _RANDOM_OPS})
    raise CannotCheck(f"could not check this model: its outputs differ between two {runtime} runs on the same "
                      f"inputs ({'op ' + ops[0] if ops else 'op unknown'}: random values without a seed?), so no "
                      "bit-for-bit comparison can judge the fold; fold without --check, or give the op a seed")


def first_mismatch(outs_a: Sequence[Any], outs_b: Sequence[Any]) -> int | None:
    for k, (a, b) in enumerate(zip(outs_a, outs_b, strict=True)):
        if not compare_values(a, b)[0]:
            return k
    return None
