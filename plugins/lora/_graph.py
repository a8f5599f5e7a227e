"""Small ONNX helpers shared by the inject and decompose passes (type/shape lookup after shape inference)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import onnx
from onnx import ModelProto, TensorProto, ValueInfoProto

from trtforge.build_engine.core.graph import Dim, tensor_dims
from trtforge.build_engine.core.shape_inference import infer_shapes

from .precision import stand_in

DimT: TypeAlias = Dim  # a dim_value, a dim_param, or unknown


@dataclass(frozen=True)
class ValueType:
    elem_type: int  # TensorProto.DataType; 0 when unknown
    shape: tuple[DimT, ...] | None  # None when the rank is unknown


def _from_value_info(vi: ValueInfoProto) -> ValueType:
    return ValueType(int(vi.type.tensor_type.elem_type), tensor_dims(vi))


def value_types(model: ModelProto) -> dict[str, ValueType]:
    """Types and shapes of every named value that ONNX shape inference can tell.

    Runs non-strict inference on a copy in which every plugin node stands in as ``Identity(y)`` (its output has y's
    type and shape), so values downstream of a plugin node (a second inject's targets) are known too.
    """
    try:
        inferred = infer_shapes(model, data_prop=True, edit=stand_in)
    except Exception:  # inference is a best-effort hint; callers fall back to initializer shapes
        inferred = model
    g = inferred.graph
    out: dict[str, ValueType] = {}
    for vi in [*g.value_info, *g.input, *g.output]:
        out[vi.name] = _from_value_info(vi)
    for init in g.initializer:
        out[init.name] = ValueType(int(init.data_type), tuple(int(d) for d in init.dims))
    return out


def make_input(name: str, elem_type: int, dims: tuple[DimT, ...]) -> ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, elem_type, [d if d is not None else None for d in dims])


def default_opset(model: ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


FLOAT_TYPES = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16", TensorProto.FLOAT: "float32"}
