"""The weight-free skeleton of a model and the checks that run on it.

``skeleton`` and ``check_model``: onnx's checker and shape inference serialise the whole model (weights included)
and parse it again in C++; for a model of tens of MB that costs more than everything else trtforge does. They run
here on a weight-free skeleton (each big initializer stood in for by a graph input of the same name, type and
shape), and ``check_model`` checks each stood-in tensor on its own with ``check_tensor`` under the model's IR version
and opsets, so it rejects what ``onnx.checker.check_model`` rejects.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import ModelProto, TensorProto

from .heap import release_free_heap
from .onnx_tensors import LOCATION_KEY, besides_initializers

# Initializers with at least this many elements are stood in for by typed graph inputs in ``skeleton``. Smaller ones
# stay: shape inference reads the values of small constants (Reshape targets, Slice bounds, ...).
SKELETON_MIN_ELEMENTS = 1024
# Floating-point initializers are stood in for from this many elements: shape inference reads a float tensor's values
# only as Resize / Upsample scales (one per dimension of the input: rank 64 and up is no model's), never as a shape or
# an index, so a float tensor of 64 elements or more only ever matters to it by type and shape. Graphs with many small
# weights (biases, norm scales) then serialise no weight bytes for the checker and inference.
SKELETON_MIN_FLOAT_ELEMENTS = 64
_FLOATS = frozenset(getattr(TensorProto, n) for n in (
    "FLOAT", "DOUBLE", "FLOAT16", "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
    "FLOAT4E2M1") if hasattr(TensorProto, n))


def _num_elements(tensor: TensorProto) -> int:
    n = 1
    for d in tensor.dims:
        n *= d
    return n


def _copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Copy every set field of protobuf message ``src`` into the empty ``dst`` except field ``skip``. Reads only the
    fields it copies: ``ListFields`` would also hand out the skipped one, and reading a bytes field copies it (a
    weight's ``raw_data``)."""
    for fd in src.DESCRIPTOR.fields:
        if fd.name == skip:
            continue
        if fd.is_repeated:
            value = getattr(src, fd.name)
            if len(value):
                getattr(dst, fd.name).extend(value)
        elif src.HasField(fd.name):
            if fd.message_type is not None:
                getattr(dst, fd.name).CopyFrom(getattr(src, fd.name))
            else:
                setattr(dst, fd.name, getattr(src, fd.name))


def weight_tensors(model: ModelProto, min_elements: int = SKELETON_MIN_ELEMENTS) -> list[TensorProto]:
    """The main graph's initializers that ``skeleton`` stands in for (at least ``min_elements`` elements)."""
    return [t for t in model.graph.initializer if _is_weight(t, min_elements)]


def _is_weight(t: TensorProto, min_elements: int) -> bool:
    """Stood in for by ``skeleton``: a big tensor (a float one from ``SKELETON_MIN_FLOAT_ELEMENTS`` elements when
    ``min_elements`` is the default), or one whose data is still on disk (``load_structure``), whose values nothing in
    memory could read anyway."""
    n = _num_elements(t)
    if n >= min_elements or t.data_location == TensorProto.EXTERNAL:
        return True
    return min_elements == SKELETON_MIN_ELEMENTS and n >= SKELETON_MIN_FLOAT_ELEMENTS and t.data_type in _FLOATS


def without_initializers(model: ModelProto) -> ModelProto:
    """A copy of ``model`` whose main graph has no initializers, everything else unchanged. For code that rebuilds the
    weights itself (precision conversion): the original weights are never copied; the caller adds back the ones it
    keeps, and the result is only valid once it has."""
    out = ModelProto()
    _copy_fields(model, out, "graph")
    _copy_fields(model.graph, out.graph, "initializer")
    return out


def weightless(model: ModelProto, min_elements: int = SKELETON_MIN_ELEMENTS) -> ModelProto:
    """A copy of ``model`` whose main-graph initializers of at least ``min_elements`` elements keep every field but
    their data (name, type, dims; no ``raw_data``): the graph's structure, as the original had it, for code that
    reads only that (input planning, type checks) after the model itself is changed in place. Not a valid model."""
    out = without_initializers(model)
    for t in model.graph.initializer:
        if _num_elements(t) < min_elements:
            out.graph.initializer.append(t)
        else:
            _copy_fields(t, out.graph.initializer.add(), "raw_data")
    return out


def skeleton(model: ModelProto, min_elements: int = SKELETON_MIN_ELEMENTS) -> ModelProto:
    """A copy of ``model`` without its weights: each main-graph initializer of at least ``min_elements`` elements is
    replaced by a graph input of the same name, element type and shape (one already declared as a graph input just
    loses its initializer). The weights are never copied, so this costs what the graph's structure costs.

    What it keeps exact: the checker's and shape inference's view of every node, value and type (only the type and
    shape of a weight matter to them; small initializers keep their values because inference reads them). What it
    leaves to the caller: the weight tensors themselves (``check_model`` checks them one by one), and for a weight that
    is also a declared graph input, the agreement of the declared type with the initializer's.
    """
    skel = without_initializers(model)
    g = skel.graph
    declared = {i.name for i in model.graph.input}
    small = []
    for t in model.graph.initializer:
        if not _is_weight(t, min_elements):
            small.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    g.initializer.extend(small)
    return skel


# onnx's checker skips the file checks of an external location starting with this (``onnx.model_container``'s
# convention for data held in memory)
_IN_MEMORY = "#"


def checker_skeleton(model: ModelProto, min_elements: int = SKELETON_MIN_ELEMENTS) -> ModelProto:
    """``skeleton(model)`` for onnx's checker: each external tensor outside the main-graph initializers (If/Loop/Scan
    body initializers, Constant values, function tensors that ``load_structure`` left on disk) is marked as held in
    memory, so the checker keeps its other checks on it but does not look for its data file in the working directory
    (an in-memory model has no folder; the loader checked the location). Only for checking: the marked locations
    must never reach a saved model (``skeleton`` itself leaves them as they are)."""
    skel = skeleton(model, min_elements)
    _mark_in_memory(skel)
    return skel


def _mark_in_memory(skel: ModelProto) -> None:
    for t in besides_initializers(skel):
        if t.data_location == TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location" and not e.value.startswith(_IN_MEMORY):
                    e.value = _IN_MEMORY + e.value


def _external_besides(model: ModelProto) -> bool:
    return any(t.data_location == TensorProto.EXTERNAL for t in besides_initializers(model))




def skeleton_bytes(model: ModelProto, min_elements: int = SKELETON_MIN_ELEMENTS, *,
                   for_checker: bool = False) -> bytes:
    """``skeleton(model).SerializeToString()`` (``checker_skeleton``'s with ``for_checker``); when no initializer
    would be stood in for (nor, for the checker, a tensor still on disk be marked), the skeleton is a copy of ``model``
    itself, so ``model`` is serialised directly (a copy of a 100k-node graph costs 6x its serialisation). Raises
    ``ValueError`` when the result is too big for protobuf."""
    weights = any(_is_weight(t, min_elements) for t in model.graph.initializer)
    data = skeleton(model, min_elements).SerializeToString() if weights else model.SerializeToString()
    # a byte search first: a walk over the nodes' attributes costs 0.4 s on a 100k-node graph
    if for_checker and LOCATION_KEY in data and _external_besides(model):
        del data
        data = checker_skeleton(model, min_elements).SerializeToString()
    elif not weights:
        return data
    release_free_heap()  # the skeleton's copy of the graph (several times its bytes) is freed: back to the OS
    return data


def check_model(model: ModelProto) -> None:
    """``onnx.checker.check_model(model)`` (raises ``onnx.checker.ValidationError``) without serialising the weights:
    the checker runs on ``skeleton(model)`` and each stood-in weight is checked as ``check_tensor`` checks it (type
    set, one value field of the right kind, enough data for its shape; see ``_check_weight``) under the model's IR
    version and opsets. IR < 4 models
    (whose initializers must also be graph inputs, which the skeleton would hide) get the full check."""
    if model.ir_version < 4:
        onnx.checker.check_model(model)
        return
    onnx.checker.check_model(checker_skeleton(model))
    check_weights(model)


def check_weights(model: ModelProto) -> None:
    """The part of ``check_model`` that the skeleton leaves out: each stood-in weight, as ``check_tensor`` checks it."""
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import}
    for t in weight_tensors(model):
        _check_weight(t, ctx)


# Bits per element of the types whose raw_data size check is done here (anything else gets onnx's own check_tensor).
_BITS = {getattr(TensorProto, name): bits for name, bits in (
    ("FLOAT", 32), ("UINT8", 8), ("INT8", 8), ("UINT16", 16), ("INT16", 16), ("INT32", 32), ("INT64", 64),
    ("BOOL", 8), ("FLOAT16", 16), ("DOUBLE", 64), ("UINT32", 32), ("UINT64", 64), ("BFLOAT16", 16),
    ("FLOAT8E4M3FN", 8), ("FLOAT8E4M3FNUZ", 8), ("FLOAT8E5M2", 8), ("FLOAT8E5M2FNUZ", 8),
    ("UINT4", 4), ("INT4", 4)) if hasattr(TensorProto, name)}
_TYPED_FIELDS = frozenset({"float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"})


def _raw_data_len(tensor: TensorProto) -> int:
    """``len(tensor.raw_data)``. Reading a bytes field makes a transient copy of it (one tensor, freed at once);
    ``ByteSize`` would be worse: protobuf's upb backend serialises the message to size it (twice the tensor)."""
    return len(tensor.raw_data)


def _check_weight(tensor: TensorProto, ctx: Any) -> None:
    """``onnx.checker.check_tensor(tensor, ctx)`` without serialising the weight when it is plainly well formed.

    Fast path, only for the common case (data in ``raw_data`` and nowhere else, a type from ``_BITS``, no negative
    dim, at least as many bytes as the shape needs): the size check is done here and every other check runs on a
    data-free stub (same fields, ``dims=[0]``, empty ``raw_data``). Anything else, including every tensor that would
    fail, is checked by onnx itself on the real tensor, so the errors are onnx's own.
    """
    if tensor.data_location == TensorProto.EXTERNAL:
        # Data still on disk (``load_structure``; its location, offset and length were checked when loading): check
        # everything else on a data-free stand-in, as for an in-memory weight below.
        stub = TensorProto()
        _copy_fields(tensor, stub, "external_data")
        stub.ClearField("data_location")
        del stub.dims[:]
        stub.dims.append(0)
        stub.raw_data = b""
        onnx.checker.check_tensor(stub, ctx)
        return
    bits = _BITS.get(tensor.data_type)
    # HasField/len, not ListFields: reading raw_data copies the weight out (a 1 GB table makes a 1 GB bytes object),
    # so it is read once, for its length, and dropped at once.
    if (bits is None or not tensor.HasField("raw_data") or any(len(getattr(tensor, f)) for f in _TYPED_FIELDS)
            or tensor.data_location == TensorProto.EXTERNAL or any(d < 0 for d in tensor.dims)):
        onnx.checker.check_tensor(tensor, ctx)
        return
    stub = TensorProto()
    _copy_fields(tensor, stub, "raw_data")
    if _raw_data_len(tensor) * 8 < _num_elements(tensor) * bits:
        onnx.checker.check_tensor(tensor, ctx)
        return
    del stub.dims[:]
    stub.dims.append(0)
    stub.raw_data = b""
    onnx.checker.check_tensor(stub, ctx)
