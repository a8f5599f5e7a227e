"""The opset a bf16 conversion needs: most ONNX ops admit bfloat16 only from opset 13 (MatMul, Add, Softmax, ...), so
an older model converted to bf16 kept every node in float32 (``bf16, 0 nodes converted``; an fp32 engine built for a
bf16 profile). It is first converted to opset 13 by onnx's version converter, as ``trtforge quantize`` does for its
Q/DQ opsets."""

from __future__ import annotations

from onnx import ModelProto

from ..core.errors import InputError

#: The default-domain opset from which MatMul, Add, Softmax, ... admit bfloat16 (opset 13); below it every node stays
#: float32 ("bf16, 0 nodes converted" and an fp32 engine for a bf16 profile).
BF16_OPSET = 13


def bf16_opset(model: ModelProto) -> ModelProto:
    """``model`` converted to opset 13 by onnx's version converter when it is older (as quantize does for its Q/DQ);
    if the converter fails, the model as it is, with a warning that most of it stays float32."""
    from ..quantize.quantizer import at_opset

    try:
        return at_opset(model, BF16_OPSET, 7, "--to bf16")
    except InputError as exc:
        import logging

        logging.getLogger("trtforge.precision").warning(
            "%s; converting it as it is: its ops admit bfloat16 only from opset 13, so they stay float32", exc.message)
        return model
