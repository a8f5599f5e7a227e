"""Loops as ``fold --check`` runs them: every Loop made to end and to run its body, and its carried inputs given
names of their own (in both models alike).

Safety conditions: the same rewrite is applied to the original and the folded model, so it changes nothing that
the comparison judges; a Loop's own semantics are kept for every trip count up to ``MAX_LOOP_TRIPS`` (an absent
condition reads a constant true, as the spec says; a trip count is replaced by its minimum with the cap), so a
difference in the first ``MAX_LOOP_TRIPS`` iterations still shows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from onnx import ModelProto, TensorProto, helper

from ..core.graph import all_graphs, rename_free, subgraphs

MAX_LOOP_TRIPS = 10_000


def _bodies(model: ModelProto) -> Iterator[tuple[Any, int]]:
    """Every node list of the model with its default-domain opset: the main graph, model-local function bodies, and
    the graphs nested in both."""
    main = _default_opset(model.opset_import, 1)
    for g in all_graphs(model.graph):
        yield g, main
    for fn in model.functions:
        opset = _default_opset(fn.opset_import, main)
        yield fn, opset
        for n in fn.node:
            for sub in subgraphs(n):
                yield from ((g, opset) for g in all_graphs(sub))


def _default_opset(opsets: Any, fallback: int) -> int:
    return next((int(o.version) for o in opsets if o.domain in ("", "ai.onnx")), fallback)


def runnable_loops(model: ModelProto) -> ModelProto:
    """A copy in which every Loop, in the graphs and in function bodies, runs as the check needs: one without a
    condition input reads a constant true (what the spec says an absent condition means: onnx.reference runs no
    iteration of such a Loop, hiding any change in its body), and its trip count is capped at ``MAX_LOOP_TRIPS``
    at every opset (``_capped_trips``) (one computed from the inputs, ``n + 1`` for a value-class
    ``n`` of 2**62, never ended; one without a trip count gets the cap as its trip count). Both models of a check
    get the same change, so a difference in the first ``MAX_LOOP_TRIPS`` iterations still shows."""
    if not any(n.op_type == "Loop" for g, _ in _bodies(model) for n in g.node):
        return model
    copy = ModelProto()
    copy.CopyFrom(model)
    count = 0
    for g, opset in _bodies(copy):
        for k in range(len(g.node) - 1, -1, -1):
            n = g.node[k]
            if n.op_type != "Loop":
                continue
            count += 1  # unique per Loop: two Loops may both have an empty first output and no node name
            tag, added = f"{n.output[0] if n.output else n.name}__trtforge_check{count}", []
            if len(n.input) > 1 and not n.input[1]:
                n.input[1] = f"{tag}_true"
                added.append(helper.make_node("Constant", [], [n.input[1]],
                                              value=helper.make_tensor("", TensorProto.BOOL, [], [True])))
            if n.input:
                n.input[0] = _capped_trips(n.input[0], tag, opset, added)
            for body in subgraphs(n):
                _own_carried_names(body, tag)
            for a in reversed(added):
                g.node.insert(k, a)
    return copy


def _own_carried_names(body: Any, tag: str) -> None:
    """Rename the body's loop-carried inputs (and their reads, nested bodies included) to names no other graph
    uses: onnx.reference seeds a Loop body's inputs with the enclosing graph's values and so gives a carried input
    named like an outer value that value in the first iteration, where the spec (and onnxruntime) give the carried
    one. A renaming changes no value."""
    for k, vi in enumerate(body.input):
        if k < 2 or not vi.name:  # the iteration number and the condition are set again before every iteration
            continue
        old, new = vi.name, f"{tag}_carried{k}"
        vi.name = new
        rename_free(body, old, new)  # reads of ``old`` in the body are reads of this input now
        for v in body.value_info:
            if v.name == old:
                v.name = new


def _capped_trips(m: str, tag: str, opset: int, added: list[Any]) -> str:
    """The name of ``min(m, MAX_LOOP_TRIPS)`` (the cap alone when the Loop has no trip count ``m``), with the nodes
    that compute it appended to ``added``: int64 Min from opset 12, Less + Where from 9, and below 9 (where
    Min and Less take floats only) a float Min between two Casts, exact for every count up to the cap."""
    cap, trips = f"{tag}_cap", f"{tag}_trips"
    added.append(helper.make_node("Constant", [], [cap],
                                  value=helper.make_tensor("", TensorProto.INT64, [], [MAX_LOOP_TRIPS])))
    if not m:  # bounded by its condition alone: the cap is its trip count
        return cap
    if opset >= 12:
        added.append(helper.make_node("Min", [m, cap], [trips]))
    elif opset >= 9:
        added += [helper.make_node("Less", [m, cap], [f"{tag}_less"]),
                  helper.make_node("Where", [f"{tag}_less", m, cap], [trips])]
    else:
        added += [helper.make_node("Cast", [m], [f"{tag}_mf"], to=TensorProto.FLOAT),
                  helper.make_node("Cast", [cap], [f"{tag}_capf"], to=TensorProto.FLOAT),
                  helper.make_node("Min", [f"{tag}_mf", f"{tag}_capf"], [f"{tag}_minf"]),
                  helper.make_node("Cast", [f"{tag}_minf"], [trips], to=TensorProto.INT64)]
    return trips
