"""What ``build`` needs to know about a quantized (explicit Q/DQ) model: whether it is one, its mode, and whether
the profile may build its fp8 tensors.

FP8 E4M3 Tensor Cores exist from compute capability 8.9 (Ada, Hopper); TensorRT-RTX refuses fp8 for 8.0/8.6
("HW-specific datatypes: fp8_e4m3"). A profile builds fp8 only when it sets ``precision.allow_fp8`` and its compute
capability is >= 8.9; otherwise the build stops before TensorRT with one line naming the profile.
"""

from __future__ import annotations

import json
from typing import Any

from onnx import ModelProto, TensorProto

from trtforge.profiles.loader import Profile

from ..core.errors import InputError

# The model metadata_props entry ``trtforge quantize`` writes and ``trtforge build`` reads into the manifest.
METADATA_KEY = "trtforge.quantization"
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
FP8_TYPES = frozenset({TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
                       TensorProto.FLOAT8E5M2FNUZ})
_MODE_BY_TYPE = {TensorProto.INT4: "int4-wo", TensorProto.UINT4: "int4-wo", TensorProto.INT8: "int8",
                 TensorProto.UINT8: "int8", **{t: "fp8" for t in FP8_TYPES}}


def uses_fp8(model: ModelProto) -> bool:
    if any(t.data_type in FP8_TYPES for t in model.graph.initializer):
        return True
    return any(a.name == "to" and a.i in FP8_TYPES for n in model.graph.node if n.op_type == "Cast"
               for a in n.attribute) or any(a.name == "value" and a.t.data_type in FP8_TYPES
                                            for n in model.graph.node if n.op_type == "Constant" for a in n.attribute)


def quantization_info(model: ModelProto) -> dict[str, Any] | None:
    """None for a float model; else the summary ``trtforge quantize`` stored (mode, calibration, excluded nodes), or
    for a model quantized elsewhere the mode read from its quantized initializers' types."""
    if not any(n.op_type in QDQ_OPS for n in model.graph.node):
        return None
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            try:
                info = json.loads(prop.value)
            except ValueError:
                break
            if isinstance(info, dict) and isinstance(info.get("mode"), str):
                return info
    inits = {t.name: t.data_type for t in model.graph.initializer}
    modes = {_MODE_BY_TYPE[inits[n.input[0]]] for n in model.graph.node
             if n.op_type == "DequantizeLinear" and inits.get(n.input[0]) in _MODE_BY_TYPE}
    mode = "fp8" if "fp8" in modes else "int4-wo" if "int4-wo" in modes else "int8"
    return {"mode": mode, "calibration": "unknown (not quantized by trtforge)", "excluded": []}


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def fp8_allowed(profile: Profile) -> bool:
    return profile.precision.allow_fp8 and _cc(profile.hardware.compute_capability) >= (8, 9)


def check_fp8_allowed(model: ModelProto, profile: Profile, source: str) -> None:
    if uses_fp8(model) and not fp8_allowed(profile):
        raise InputError(f"{source} has fp8 tensors but profile {profile.name!r} (compute capability "
                         f"{profile.hardware.compute_capability}) does not allow fp8; fp8 needs compute capability "
                         ">= 8.9 and allow_fp8 = true (e.g. --profile l40s), or quantize with --mode int8 / int4-wo")
