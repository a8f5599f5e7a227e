"""The one shape-inference wrapper: ``onnx.shape_inference`` on the weight-free skeleton.

onnx serialises the whole model to infer, and for a model of tens of MB the weights would cost more than everything
else; the skeleton (``onnx_skeleton.skeleton``) stands in each big weight by a typed graph input of the same name, and
inference reads only small constants' values, which the skeleton keeps. Its own module because it needs both
``graph`` (the protobuf limit) and ``onnx_skeleton``, and ``onnx_io`` imports both.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import GraphProto, ModelProto

from .graph import PROTO_LIMIT
from .onnx_skeleton import skeleton, skeleton_bytes


def infer_shapes(model: ModelProto, *, strict: bool = False, check_type: bool = False, data_prop: bool = False,
                 edit: Callable[[GraphProto], None] | None = None) -> ModelProto:
    """``onnx.shape_inference.infer_shapes`` on ``model``'s weight-free skeleton; returns the inferred skeleton.

    Read types and shapes from its ``value_info`` / inputs / outputs: big weights appear there as typed graph inputs
    of the same name. ``edit`` may change the skeleton's main graph first (precision conversion stands in for plugin
    nodes). Raises what onnx raises, and ``ValueError`` when even the skeleton is too big for protobuf.
    """
    try:  # serialised once (``ByteSize`` would serialise it once more under upb just to size it)
        if edit is None:
            data = skeleton_bytes(model)
        else:
            skel = skeleton(model)
            edit(skel.graph)
            data = skel.SerializeToString()
            del skel
    except ValueError:
        data = b""
    if not data or len(data) >= PROTO_LIMIT:
        raise ValueError("the model's structure alone is too big for ONNX shape inference")
    return onnx.shape_inference.infer_shapes(data, check_type=check_type, strict_mode=strict, data_prop=data_prop)
