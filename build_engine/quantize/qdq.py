"""Explicit Q/DQ insertion, in the form TensorRT's strongly typed networks (TensorRT 10+/11, TensorRT-RTX) build.

For each activation edge feeding quantized projections (one per activation, shared by q/k/v):
``x -> [Mul(1/s): migration] -> [QuantizeLinear -> DequantizeLinear: per-tensor scale, zero point 0] -> MatMul``.
The Mul and the Q/DQ pair sit on the projections' edge only: any other reader of ``x`` (a LoRA plugin node, a
residual) keeps the float ``x``. For each weight: the stored int8 / fp8 / int4 initializer and its float32 scales
behind one ``DequantizeLinear`` (per output channel, ``axis=1``; int4 per block, ``axis=0, block_size``). Every
scale is float32, so both operands of a MatMul dequantize to one type (TensorRT refuses a MatMul whose operand
scales differ in type). Weight-only (int4) edges get the migration Mul and no activation Q/DQ. An int4 weight of one
block and one output channel has one scale: it is written per tensor (no ``block_size``), which TensorRT builds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from ..core.graph import Namer, all_graphs
from ..core.onnx_io import MIGRATION_DOC
from .config import MIN_IR, MIN_OPSET
from .numerics import act_scale
from .targets import Target


@dataclass(frozen=True)
class EdgePlan:
    """What goes on one activation edge: ``inv_scale`` (1/s per input channel) and/or a per-tensor range."""

    x: str
    consumers: tuple[int, ...]  # indices of the projection MatMuls reading x (their input 0 is rewired)
    inv_scale: np.ndarray | None
    act_amax: float | None


@dataclass(frozen=True)
class StoredWeight:
    """One projection's weight as written: its stored values and float32 scales (``numerics.quantize_weight`` of the
    migrated weight), and ``key``, the digest of what was quantized (migrated values, block, clip ratios): readers of
    one source weight with equal keys share one stored form. The float weight is not kept: the quantizer quantizes
    each weight as soon as its plan is known and drops it, so the float weights are never all in memory at once."""

    target: Target
    q: np.ndarray       # int8 / fp8 / int4 [in, out]
    scale: np.ndarray   # float32 scales (per output channel; int4: [blocks, out])
    block: int          # int4: rows per block (divides in_features: TensorRT builds whole blocks only); else 0
    key: bytes


def _zero_point(mode: str, name: str) -> TensorProto:
    if mode == "fp8":
        import ml_dtypes

        return numpy_helper.from_array(np.array(0, ml_dtypes.float8_e4m3fn), name)
    return numpy_helper.from_array(np.array(0, np.int8), name)


def _edge_nodes(edge: EdgePlan, mode: str, new: Namer, inits: list[TensorProto]) -> tuple[list[NodeProto], str]:
    nodes: list[NodeProto] = []
    cur = edge.x
    if edge.inv_scale is not None:
        inv = new(f"{edge.x}_migration_inv_scale")
        inits.append(numpy_helper.from_array(edge.inv_scale.astype(np.float32), inv))
        out = new(f"{edge.x}_migrated")
        mul = helper.make_node("Mul", [cur, inv], [out], name=new(f"{edge.x}/migration/Mul"))
        mul.doc_string = MIGRATION_DOC
        nodes.append(mul)
        cur = out
    if edge.act_amax is not None:
        scale, zp = new(f"{edge.x}_act_scale"), new(f"{edge.x}_act_zero_point")
        inits.append(numpy_helper.from_array(np.array(act_scale(edge.act_amax, mode), np.float32), scale))
        inits.append(_zero_point(mode, zp))
        q, dq = new(f"{cur}_quantized"), new(f"{cur}_dequantized")
        nodes.append(helper.make_node("QuantizeLinear", [cur, scale, zp], [q], name=new(f"{edge.x}/QuantizeLinear")))
        nodes.append(helper.make_node("DequantizeLinear", [q, scale, zp], [dq],
                                      name=new(f"{edge.x}/DequantizeLinear")))
        cur = dq
    return nodes, cur


def _weight_node(stored: StoredWeight, mode: str, new: Namer, inits: list[TensorProto]) -> tuple[NodeProto, str]:
    t, block, q, scale = stored.target, stored.block, stored.q, stored.scale
    attrs: dict[str, Any] = {"axis": 0, "block_size": block} if mode == "int4-wo" else {"axis": 1}
    if mode == "int4-wo" and scale.size == 1:
        # one block of one output channel ([block, 1]: a value head): TensorRT refuses a one-element block scale
        # ("ScaleMode is illegal"); the per-tensor form with the same scale is the same arithmetic and builds
        scale, attrs = scale.reshape(()), {}
    qname, sname = new(f"{t.weight}_quantized"), new(f"{t.weight}_scale")
    inits.append(numpy_helper.from_array(q, qname))
    inits.append(numpy_helper.from_array(scale, sname))
    out = new(f"{t.weight}_dequantized")
    node = helper.make_node("DequantizeLinear", [qname, sname], [out], name=new(f"{t.name}/weight/DequantizeLinear"),
                            **attrs)
    return node, out


def _bump_opset(model: ModelProto, mode: str) -> None:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version < MIN_OPSET[mode]:
            imp.version = MIN_OPSET[mode]
    model.ir_version = max(model.ir_version, MIN_IR[mode])


def rewrite(model: ModelProto, mode: str, edges: Mapping[str, EdgePlan],
            weights: Sequence[StoredWeight]) -> ModelProto:
    """A new model with the edges and weights quantized (``model`` is not mutated)."""
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    new = Namer(out)
    inits: list[TensorProto] = []
    before: dict[int, list[NodeProto]] = {}
    edge_out: dict[str, str] = {}
    for x, edge in edges.items():
        nodes, edge_out[x] = _edge_nodes(edge, mode, new, inits)
        before.setdefault(min(edge.consumers), []).extend(nodes)
        for i in edge.consumers:
            g.node[i].input[0] = edge_out[x]
    made: dict[str, dict[bytes, str]] = {}  # source weight -> the stored forms written for it (key -> output)
    for plan in weights:
        # a weight shared by projections is stored once per distinct stored form (same migrated values, block and
        # clip: fp8, rtn, or one SmoothQuant/AWQ group), not once per reader; ``weights`` are in node order, so the
        # DequantizeLinear sits before its first reader
        w_out = made.get(plan.target.weight, {}).get(plan.key)
        if w_out is None:
            node, w_out = _weight_node(plan, mode, new, inits)
            before.setdefault(plan.target.index, []).append(node)
            made.setdefault(plan.target.weight, {})[plan.key] = w_out
        g.node[plan.target.index].input[1] = w_out
    nodes = []
    for i, node in enumerate(g.node):
        nodes.extend(before.get(i, []))
        nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)
    # an initializer stays while anything reads it: a node of any graph (a body captures it from this scope) or a
    # graph output (a weight that is also an output keeps its float value there)
    used = {name for sub in all_graphs(g) for n in sub.node for name in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep + inits)
    _bump_opset(out, mode)
    return out
