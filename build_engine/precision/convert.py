"""fp32 -> fp16 / bf16 conversion for strongly typed TensorRT networks.

``convert_precision(model, "fp16"|"bf16")`` rewrites float32 tensors and initializers to the low type, keeps the
numerically sensitive parts in fp32 (policy and reasons in ``precision_policy``) with Casts around them, keeps the
graph's input and output dtypes (so the engine's I/O matches the original model), then runs the exact fold
pipeline so no redundant Cast is left. The input model is not mutated.

Why not onnxconverter-common's ``convert_float_to_float16``: it has no bf16 mode, and it converts index chains
(``Cast(int -> float) -> Mul(inv_freq) -> Sin/Cos``, ``Cast(Shape) -> Mul -> Cast(int64)``) to fp16, which loses
rotary angles and shape arithmetic. One converter with one policy serves both types here.

Safety conditions: only top-level nodes are converted (subgraph ops and ops without an ONNX schema stay fp32 and
untouched, except trtforge plugin nodes, which follow their op contract: see ``precision_plugins``); fp16
constants are clipped to +-65504 only where a node runs in fp16 (a node with a constant beyond that range stays fp32,
policy rule 8; so an fp32 finite value never becomes inf, except -inf/inf/nan which stay what they
are); bf16 rounding is round-to-nearest-even (ml_dtypes).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from trtforge.plugins import is_plugin_node
from trtforge.plugins.lora import precision as precision_plugins

from ..core import onnx_skeleton, steps
from ..core.errors import InputError, ModelError
from ..core.graph import Namer
from ..core.shape_inference import infer_shapes
from ..passes.protos import constant_node_tensor
from .fp16_range import beyond_fp16, negative_exponents, vanish_in_fp16
from .opset import bf16_opset
from .policy import FLOAT, KEEP_OPS, LOW_TYPES, Mode, NodeDecision, decide
from .report import PrecisionReport

PRECISIONS = tuple(LOW_TYPES)
_NO_UPCAST = frozenset({"Cast", "Shape", "Size"})  # ops whose input dtype does not change the result
# CastLike's first input does not either, but its second (``target_type``) is the output's type: when the node stays
# fp32 that input is cast back up, or a converted producer would make it return the low type.
_NO_UPCAST_INPUT = {"CastLike": 0}
_FP16_MAX = float(np.finfo(np.float16).max)


@dataclass(frozen=True)
class PrecisionResult:
    model: ModelProto
    report: PrecisionReport


def _infer(model: ModelProto, *, strict: bool) -> ModelProto:
    """Shape inference on the weight-free skeleton (``core.shape_inference.infer_shapes``) with plugin nodes replaced by
    Identity stand-ins, which carry y's type and shape to their output as the op does (``precision_plugins``).
    ``check_type`` as the fold pipeline's check has it: without it onnx 1.23 infers no output type for ops defined by
    a function body such as GroupNormalization (18, 21), and a valid model's next node then fails strict inference."""
    return infer_shapes(model, strict=strict, check_type=True, edit=precision_plugins.stand_in)


def _value_types(model: ModelProto) -> dict[str, int]:
    try:
        inferred = _infer(model, strict=False)
    except Exception as exc:
        raise ModelError(f"shape inference failed before precision conversion ({exc}); fix the model") from exc
    g = inferred.graph
    types: dict[str, int] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for init in model.graph.initializer:
        types[init.name] = init.data_type
    for node in g.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.HasField("t"):
                    types[node.output[0]] = a.t.data_type
    return types


def _constant_tensors(model: ModelProto, *, overridable: bool = False) -> dict[str, TensorProto]:
    """Initializers, Constant nodes' values, and Identity aliases of those (exporters put Identity on tied or
    shared weights), so a low consumer gets a converted initializer instead of a runtime Cast of fp32 weights.

    An initializer that is also a graph input is only a default the caller may override at run time (as fold's
    ``constant_tensor`` reads it): not a constant, unless ``overridable`` (rule 8 reads its default's range: a value
    beyond +-65504 keeps its consumers fp32). A converted copy of it would be read instead of the fed value."""
    inputs = set() if overridable else {vi.name for vi in model.graph.input}
    consts = {t.name: t for t in model.graph.initializer if t.name not in inputs}
    for node in model.graph.node:
        if node.op_type == "Constant":  # value, or value_float(s) / value_int(s): an epsilon is often written so
            value = constant_node_tensor(node)
            if value is not None:
                consts[node.output[0]] = value
        elif node.op_type == "Identity" and node.input and node.input[0] in consts:
            consts[node.output[0]] = consts[node.input[0]]
    return consts


def to_low_array(array: np.ndarray, to: str) -> np.ndarray:
    """float32 -> float16 (finite values clipped to +-65504) or bfloat16 (round to nearest even)."""
    if to == "fp16":
        finite = np.isfinite(array)
        clipped = np.where(finite, np.clip(array, -_FP16_MAX, _FP16_MAX), array)
        return clipped.astype(np.float16)
    import ml_dtypes

    return array.astype(ml_dtypes.bfloat16)


_CHUNK = 1 << 22  # elements converted at a time: the temporaries of to_low_array stay at a few tens of MB


def _plain_raw_fp32(tensor: TensorProto) -> bool:
    return (tensor.data_type == FLOAT and tensor.HasField("raw_data") and not len(tensor.float_data)
            and tensor.data_location != TensorProto.EXTERNAL)


def _low_chunked(tensor: TensorProto, to: str) -> np.ndarray:
    """``to_low_array`` of a raw-data float32 tensor, converted ``_CHUNK`` elements at a time from a view of the one
    copy of its bytes that reading ``raw_data`` makes (a whole-tensor conversion would hold several float32-sized
    temporaries at once: a 1 GB weight cost 3 GB more)."""
    raw = tensor.raw_data
    src = np.frombuffer(raw, dtype="<f4")
    dims = tuple(int(d) for d in tensor.dims)
    first = to_low_array(src[:1], to)
    low = np.empty(src.size, dtype=first.dtype)
    for start in range(0, src.size, _CHUNK):
        low[start:start + _CHUNK] = to_low_array(src[start:start + _CHUNK], to)
    return low.reshape(dims)


def _low_from_disk(tensor: TensorProto, to: str, data_dir: Path) -> np.ndarray:
    """``to_low_array`` of a float32 tensor still on disk (a lazy load), read and converted ``_CHUNK`` elements at a
    time: the float32 weight is never in memory."""
    from ..core.lazy_weights import read_chunks

    first = to_low_array(np.zeros(1, np.float32), to)
    n = _num_elements(tensor)
    low = np.empty(n, dtype=first.dtype)
    start = 0
    for part in read_chunks(tensor, data_dir, "<f4", _CHUNK):
        low[start:start + part.size] = to_low_array(part, to)
        start += part.size
    if start != n:
        raise ModelError(f"initializer {tensor.name!r}: its external data holds {start} elements, not {n}")
    return low.reshape(tuple(int(d) for d in tensor.dims))


def _num_elements(tensor: TensorProto) -> int:
    n = 1
    for d in tensor.dims:
        n *= int(d)
    return n


def _low_tensor(tensor: TensorProto, name: str, to: str, out: TensorProto | None = None,
                data_dir: Path | None = None) -> TensorProto:
    """``tensor`` converted to ``to``, as ``numpy_helper.from_array`` would make it; written into ``out`` (a fresh
    element of the destination's repeated field) when given, so a converted weight is not copied once more.
    ``data_dir``: where a tensor still on disk (lazy load) has its data."""
    if tensor.data_location == TensorProto.EXTERNAL and data_dir is not None and tensor.data_type == FLOAT:
        low = _low_from_disk(tensor, to, data_dir)
    elif _plain_raw_fp32(tensor):
        low = _low_chunked(tensor, to)
    else:
        low = to_low_array(numpy_helper.to_array(tensor), to)
    out = TensorProto() if out is None else out
    out.dims.extend(low.shape)
    if name:  # as from_array: an empty name stays unset
        out.name = name
    raw = numpy_helper.tobytes_little_endian(low)
    del low  # the converted array is not held beside its bytes and the message's copy of them
    out.raw_data = raw
    out.data_type = LOW_TYPES[to]
    return out


def _names_read(nodes: Iterable[NodeProto]) -> set[str]:
    """Every value name the nodes read, including those their subgraphs read from the outer scope."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.input)
        for a in node.attribute:
            if a.HasField("g"):
                names |= _names_read(a.g.node)
            for sub in a.graphs:
                names |= _names_read(sub.node)
    return names


def _needs_conversion(model: ModelProto, decisions: dict[int, Any], types: dict[str, int]) -> bool:
    """Whether any node that runs in the low type reads or writes a float32 value or holds a float32 tensor."""
    for i, node in enumerate(model.graph.node):
        if decisions[i].mode is not Mode.LOW:
            continue
        if any(n and types.get(n) == FLOAT for n in (*node.input, *node.output)):
            return True
        if any(a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FLOAT for a in node.attribute):
            return True
    return False


def _unchanged(model: ModelProto, to: str, decisions: dict[int, Any], fold: bool, start: float) -> PrecisionResult:
    modes = Counter(d.mode.value for d in decisions.values())
    kept = Counter(model.graph.node[i].op_type for i, d in decisions.items() if d.mode is Mode.KEEP)
    out, fold_report = model, None
    if fold:
        from ..passes import fold as run_fold

        folded = run_fold(model)
        out, fold_report = folded.model, folded.report
    report = PrecisionReport(to=to, nodes_low=modes.get("low", 0), nodes_fp32=modes.get("keep", 0),
                             nodes_untouched=modes.get("untouched", 0), kept_fp32_ops=dict(sorted(kept.items())),
                             casts_inserted=0, initializers_converted=0, plugin_nodes_low=0, pool_inputs_converted=0,
                             already=True, fold=fold_report, seconds=round(time.perf_counter() - start, 4))
    return PrecisionResult(model=out, report=report)


def node_decisions(model: ModelProto, to: str = "fp16", keep_ops: frozenset[str] = KEEP_OPS,
                   range_exempt: frozenset[str] = frozenset(), subgraph_reads: bool = True) -> dict[int, NodeDecision]:
    """The policy's decision for each top-level node (by index), without converting anything.

    ``trtforge quantize`` asks this so that what stays in float under quantization is what stays in fp32 under
    ``trtforge precision``: one policy (norms, softmax, rotary/position arithmetic, shape and index chains, plugins
    by their op contract), not a second list. ``range_exempt``: constants rules 8 and 10 (a constant beyond +-65504,
    or one fp16 rounds to zero, keeps its consumers fp32) do not apply to; quantize exempts projection weights, which
    it stores with float32 per-channel / per-block scales (a value computed from another wide constant, a mask
    sentinel, still counts). ``subgraph_reads=False``: rule 7 (an output an If/Loop/Scan body reads stays fp32,
    since the body is not converted) does not apply; quantize passes it, as Q/DQ leave every output's type as it
    is (a projection whose output a body read was kept float, reported as the policy's choice).
    """
    consts = _constant_tensors(model)
    wide = beyond_fp16(_constant_tensors(model, overridable=True), to) - range_exempt
    tiny = vanish_in_fp16(consts, to) - range_exempt
    return decide(model, _value_types(model), set(consts), to, keep_ops, wide=wide, tiny=tiny,
                  negative=negative_exponents(model, consts, to), subgraph_reads=subgraph_reads)


@steps.timed("convert")
def convert_precision(model: ModelProto, to: str, *, fold: bool = True,
                      keep_ops: frozenset[str] = KEEP_OPS, data_dir: Path | None = None) -> PrecisionResult:
    """Convert ``model`` to ``to`` ("fp16" / "bf16"); see the module docstring. Returns a new model and a report;
    ``model`` itself (folded into a new one if ``fold``) when nothing is float32 where the low type runs (report key
    ``already``: true). ``data_dir``: the source model's folder when it was loaded lazily (``onnx_io.load(...,
    lazy=True)``): weights still on disk are converted from their file, the others stay there (save the result with
    ``save_model(..., source_dir=data_dir)``)."""
    if to not in LOW_TYPES:
        raise InputError(f"unknown precision {to!r}; choose one of {', '.join(PRECISIONS)}")
    start = time.perf_counter()
    low = LOW_TYPES[to]
    model = bf16_opset(model) if to == "bf16" else model
    # The analysis reads ``model``; the rewrite edits ``src``, a copy without the initializers: the fp32 weights are
    # never copied (most become converted copies); the ones still used as they are are copied back at the end.
    types = _value_types(model)
    consts = _constant_tensors(model)
    wide = beyond_fp16(_constant_tensors(model, overridable=True), to, data_dir)
    decisions = decide(model, types, set(consts), to, keep_ops, wide=wide, tiny=vanish_in_fp16(consts, to),
                       negative=negative_exponents(model, consts, to))
    if not _needs_conversion(model, decisions, types) and not precision_plugins.pools_to_retype(
            model, [n for i, n in enumerate(model.graph.node) if decisions[i].mode is Mode.LOW
                    and is_plugin_node(n)], types):
        # Already in the target precision (no fp32 value enters or leaves a node that runs in it): the model is
        # returned as it is, without copying its weights (a build of a bf16 model for a bf16 profile).
        return _unchanged(model, to, decisions, fold, start)
    namer = Namer(model)
    src = onnx_skeleton.without_initializers(model)
    new_type = dict(types)
    low_plugins = [n for i, n in enumerate(model.graph.node)
                   if decisions[i].mode is Mode.LOW and is_plugin_node(n)]
    # Adapter-pool graph inputs are declared in the low type (they are adapter data, not the user's I/O).
    retyped = precision_plugins.pools_to_retype(model, low_plugins, types)
    for name in retyped:
        new_type[name] = low
    for vi in src.graph.input:
        if vi.name in retyped:
            vi.type.tensor_type.elem_type = low
    down: dict[str, str] = {}   # float32 value -> its low copy (Cast output or converted initializer)
    up: dict[str, str] = {}     # low value that was float32 -> its float32 copy
    converted_inits = 0  # written straight into src's (empty) initializer list
    nodes: list[NodeProto] = []
    casts = 0

    def lowered(name: str) -> str:
        nonlocal casts, converted_inits
        if name not in down:
            new = namer(f"{name}__{to}")
            if name in consts:
                _low_tensor(consts[name], new, to, out=src.graph.initializer.add(), data_dir=data_dir)
                converted_inits += 1
            else:
                nodes.append(helper.make_node("Cast", [name], [new], name=namer(f"{new}/Cast"), to=low))
                casts += 1
            down[name] = new
        return down[name]

    def raised(name: str) -> str:
        nonlocal casts
        if name not in up:
            new = namer(f"{name}__fp32")
            nodes.append(helper.make_node("Cast", [name], [new], name=namer(f"{new}/Cast"), to=FLOAT))
            casts += 1
            up[name] = new
        return up[name]

    for idx, node in enumerate(src.graph.node):
        d = decisions[idx]
        if d.mode is Mode.LOW:
            for i in d.float_inputs:
                name = node.input[i]
                if new_type.get(name) == FLOAT:
                    node.input[i] = lowered(name)
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FLOAT:
                    a.t.CopyFrom(_low_tensor(a.t, a.t.name, to))
            for name in node.output:
                if name and new_type.get(name) == FLOAT:
                    new_type[name] = low
        elif d.mode is Mode.KEEP and node.op_type not in _NO_UPCAST:
            for i, name in enumerate(node.input):
                if name and types.get(name) == FLOAT and new_type.get(name) == low and (
                        _NO_UPCAST_INPUT.get(node.op_type) != i):
                    node.input[i] = raised(name)
        nodes.append(node)

    # Keep the graph's output dtypes: a float32 output now produced in the low type gets a Cast back.
    tail: list[NodeProto] = []
    for out in src.graph.output:
        if types.get(out.name) == FLOAT and new_type.get(out.name) == low:
            inner = namer(f"{out.name}__{to}")
            for n in nodes:
                n.input[:] = [inner if x == out.name else x for x in n.input]
                n.output[:] = [inner if x == out.name else x for x in n.output]
            tail.append(helper.make_node("Cast", [inner], [out.name], name=namer(f"{out.name}/Cast"), to=FLOAT))
            casts += 1
    # An Identity alias of a constant (a tied weight) whose consumers all read the converted copy now is dead:
    # dropping it keeps the fp32 original out of the converted model instead of copying it for fold to remove.
    read = _names_read([*nodes, *tail]) | {o.name for o in src.graph.output}
    nodes = [n for n in nodes if not (n.op_type == "Identity" and len(n.output) == 1 and n.output[0] in down
                                      and n.input[0] in consts and n.output[0] not in read)]
    g = src.graph
    del g.node[:]
    g.node.extend([*nodes, *tail])
    used = _names_read(g.node) | {o.name for o in g.output}
    g.initializer.extend(t for t in model.graph.initializer if t.name in used)  # after the converted ones
    del g.value_info[:]
    try:
        # The checker on the structure and on every weight, converted ones included (without serialising them), then
        # strict inference on the stand-in skeleton: every value's type must agree with its producer's schema.
        onnx_skeleton.check_model(src)
        inferred = _infer(src, strict=True)
        onnx.checker.check_model(inferred)
    except Exception as exc:  # a bug in the conversion, unless the source itself fails the same checks
        raise _blame(model, to, exc) from exc
    if any(is_plugin_node(n) for n in g.node):
        ig = inferred.graph
        after = {v.name: v.type.tensor_type.elem_type for v in [*ig.input, *ig.value_info, *ig.output]}
        after.update({t.name: t.data_type for t in g.initializer})
        precision_plugins.check_types(src, after)
    g.value_info.extend(inferred.graph.value_info)
    converted = src
    modes = Counter(d.mode.value for d in decisions.values())
    kept = Counter(model.graph.node[i].op_type for i, d in decisions.items() if d.mode is Mode.KEEP)
    fold_report = None
    if fold:
        from ..passes import fold as run_fold

        folded = run_fold(converted, inplace=True)  # ``converted`` is this function's own new model
        converted, fold_report = folded.model, folded.report
    report = PrecisionReport(to=to, nodes_low=modes.get("low", 0), nodes_fp32=modes.get("keep", 0),
                             nodes_untouched=modes.get("untouched", 0), kept_fp32_ops=dict(sorted(kept.items())),
                             casts_inserted=casts, initializers_converted=converted_inits,
                             plugin_nodes_low=len(low_plugins), pool_inputs_converted=len(retyped),
                             fold=fold_report, seconds=round(time.perf_counter() - start, 4))
    return PrecisionResult(model=converted, report=report)


def _blame(model: ModelProto, to: str, exc: Exception) -> ModelError:
    """The error for a converted model that fails validation: the source's, when strict inference rejects the source
    too (its declared shapes or types disagree with its ops: no conversion could fix that), else the conversion's."""
    try:
        _infer(model, strict=True)
    except Exception as src_exc:  # noqa: BLE001 (any failure of onnx's inference is the source's)
        return ModelError(f"the source model fails strict shape inference ({src_exc}); fix the export (its declared "
                          "shapes or types disagree with its ops), then convert it")
    return ModelError(f"precision conversion to {to} produced an invalid model ({exc})")
