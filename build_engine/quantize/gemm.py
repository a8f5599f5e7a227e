"""Gemm projections lowered to ``MatMul`` (+ ``Add``), so a ``Linear`` exported with 2-D inputs (``Gemm``,
usually ``transB=1``) is quantized like every MatMul projection.

A Gemm can be lowered when all hold (otherwise it stays a float Gemm and ``candidates`` says which one failed):
- default domain, at opset >= 7 (Gemm-6 has a ``broadcast`` attribute), only the attributes alpha, beta, transA,
  transB;
- ``transA = 0`` and input A is a runtime tensor (not an initializer);
- B is a 2-D float32 initializer that is not also a graph input (an IR < 4 default the caller may override);
- ``alpha = 1`` and, when C is given, ``beta = 1`` (so the lowered form computes the same expression).

The lowered form: ``MatMul(A, W)`` named as the Gemm (its report label), with ``W = B`` (``transB = 0``) or a new
initializer ``B^T`` (``transB = 1``, shared by every Gemm of that B), then ``Add(., C)`` when C is given, marked with
``GEMM_BIAS_DOC`` (the LM-head search follows it as data movement). ``Add`` broadcasts every C that Gemm accepts
(unidirectional to ``[M, N]``) to the same ``[M, N]`` result. A float result of the lowered pair may differ from the
Gemm's in the last bits (another kernel's summation order), so ``quantizer`` lowers only the Gemms it then
quantizes; a Gemm that stays float is never touched. ``B`` is removed when no node reads it any more.

A MatMul reading ``Transpose(W)`` of an initializer (``x @ W.T`` from an exporter without constant folding, a tied
LM head ``h @ embed.T``) is given ``W^T`` as a new initializer the same way (``untranspose``), again only for the
MatMuls ``quantizer`` then quantizes.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from ..core.graph import Namer, all_graphs
from ..core.lazy_weights import to_array
from .targets import GEMM_BIAS_DOC, node_label

_ATTRS = frozenset({"alpha", "beta", "transA", "transB"})


def _opset(model: ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def _why_not(node: NodeProto, model: ModelProto, inits: dict[str, TensorProto], fed: set[str]) -> str | None:
    attrs = {a.name: a for a in node.attribute}
    if _opset(model) < 7 or set(attrs) - _ATTRS:
        return "Gemm before opset 7 (broadcast attribute) is not quantized"
    if attrs.get("transA") is not None and attrs["transA"].i != 0:
        return "Gemm with transA=1 is not quantized"
    if node.input[0] in inits:
        return "its input A is a constant"
    w = inits.get(node.input[1])
    if w is None or w.data_type != TensorProto.FLOAT or len(w.dims) != 2:
        return "its weight B is not a 2-D float32 initializer"
    if w.name in fed:
        return f"its weight {w.name!r} is a graph input (overridable at run time)"
    if attrs.get("alpha") is not None and attrs["alpha"].f != 1.0:
        return "Gemm with alpha != 1 is not quantized"
    has_c = len(node.input) > 2 and node.input[2] != ""
    if has_c and attrs.get("beta") is not None and attrs["beta"].f != 1.0:
        return "Gemm with beta != 1 is not quantized"
    return None


def candidates(model: ModelProto) -> dict[str, str | None]:
    """Every top-level default-domain Gemm's label -> None (can be lowered) or the reason it cannot."""
    inits = {t.name: t for t in model.graph.initializer}
    fed = {vi.name for vi in model.graph.input}
    return {node_label(n, i): _why_not(n, model, inits, fed) for i, n in enumerate(model.graph.node)
            if n.op_type == "Gemm" and n.domain in ("", "ai.onnx")}


def lower(model: ModelProto, labels: Collection[str], data_dir: Path | None = None) -> ModelProto:
    """A copy of ``model`` with the Gemms labelled ``labels`` (each one ``candidates`` accepts) lowered;
    ``data_dir``: where a lazily loaded model's weights still on disk are (a transposed B is read from there)."""
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    fresh = Namer(out)
    transposed: dict[str, str] = {}
    nodes: list[NodeProto] = []
    for i, node in enumerate(g.node):
        label = node_label(node, i)
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or label not in labels:
            nodes.append(node)
            continue
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        w = node.input[1]
        if trans_b:
            if w not in transposed:
                transposed[w] = fresh(f"{w}_transposed")
                t = np.ascontiguousarray(to_array(inits[w], data_dir).T)
                g.initializer.append(numpy_helper.from_array(t, transposed[w]))
            w = transposed[w]
        has_c = len(node.input) > 2 and node.input[2] != ""
        y = fresh(f"{node.output[0]}_matmul") if has_c else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], w], [y], name=label))
        if has_c:
            add = helper.make_node("Add", [y, node.input[2]], [node.output[0]], name=fresh(f"{label}/bias"))
            add.doc_string = GEMM_BIAS_DOC
            nodes.append(add)
    del g.node[:]
    g.node.extend(nodes)
    # any graph's reader counts (a subgraph may capture B from this scope)
    read = {name for sub in all_graphs(g) for n in sub.node for name in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name not in transposed or t.name in read]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)
    return out


def _flipped(node: NodeProto, producers: dict[str, NodeProto], inits: dict[str, TensorProto],
             fed: set[str]) -> str | None:
    """The initializer W when ``node`` is a default-domain MatMul whose input B is ``Transpose(W)`` (perm [1, 0] or
    none) of a 2-D float32 initializer that is not a graph input; else None."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    t = producers.get(node.input[1])
    if t is None or t.op_type != "Transpose" or t.domain not in ("", "ai.onnx") or not t.input:
        return None
    w = inits.get(t.input[0])
    perm = next((list(a.ints) for a in t.attribute if a.name == "perm"), [1, 0])
    if w is None or w.data_type != TensorProto.FLOAT or len(w.dims) != 2 or w.name in fed or perm != [1, 0]:
        return None
    return w.name


def transposed_weights(model: ModelProto) -> set[str]:
    """Labels of the top-level MatMuls whose weight is ``Transpose(W)`` of an initializer (an exporter's
    ``x @ W.T`` without constant folding, a tied LM head ``h @ embed.T``): ``untranspose`` makes them projections."""
    g = model.graph
    producers = {o: n for n in g.node for o in n.output}
    inits = {t.name: t for t in g.initializer}
    fed = {vi.name for vi in g.input}
    return {node_label(n, i) for i, n in enumerate(g.node) if _flipped(n, producers, inits, fed) is not None}


def untranspose(model: ModelProto, labels: Collection[str], data_dir: Path | None = None,
                trial: bool = False) -> ModelProto:
    """A copy of ``model`` where each MatMul labelled ``labels`` (one ``transposed_weights`` found) reads ``W^T`` as
    a new initializer (one per W) instead of ``Transpose(W)``; the Transpose stays for any other reader (the fold
    after quantization removes it when none is left). The same values: the float product is the same. ``trial``:
    for ``select`` only, which reads shapes and the set of values (ranges): ``W`` with its dims swapped stands in for
    ``W^T`` (a weight still on disk stays a pointer into its file; a tied 1 GiB head is not transposed to decide that
    it stays float)."""
    if not labels:
        return model
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    producers = {o: n for n in g.node for o in n.output}
    inits = {t.name: t for t in g.initializer}
    fed = {vi.name for vi in g.input}
    fresh = Namer(out)
    made: dict[str, str] = {}
    for i, node in enumerate(g.node):
        w = _flipped(node, producers, inits, fed) if node_label(node, i) in labels else None
        if w is None:
            continue
        if w not in made:
            made[w] = fresh(f"{w}_transposed")
            if trial:
                stand_in = g.initializer.add()
                stand_in.CopyFrom(inits[w])
                stand_in.name = made[w]
                stand_in.dims[:] = list(reversed(inits[w].dims))
            else:
                g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(to_array(inits[w], data_dir).T),
                                                             made[w]))
        node.input[1] = made[w]
    return out
