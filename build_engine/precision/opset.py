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
    try:
        return at_opset(model, BF16_OPSET, 7, "--to bf16")
    except InputError as exc:
        import logging

        logging.getLogger("trtforge.precision").warning(
            "%s; converting it as it is: its ops admit bfloat16 only from opset 13, so they stay float32", exc.message)
        return model


def at_opset(model: ModelProto, target: int, min_ir: int, what: str) -> ModelProto:
    """``_at_opset`` for any ``target`` opset (IR at least ``min_ir``); ``what`` names the option that needs it."""
    from onnx import version_converter

    from ..core.onnx_skeleton import skeleton, without_initializers

    opset = max((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), default=0)
    if opset >= target:
        return model
    skel = skeleton(model)
    stood_in = {i.name for i in skel.graph.input} - {i.name for i in model.graph.input}
    try:
        converted = version_converter.convert_version(skel, target)
    except Exception as exc:  # onnx raises RuntimeError/ConvertError with the adapter's message
        text = " ".join(str(exc).split())[:200]
        raise InputError(f"the model is opset {opset}; {what} needs opset >= {target} and onnx's "
                         f"version converter failed ({text}); re-export the model at opset >= "
                         f"{target}") from exc
    g = converted.graph
    small = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in stood_in]
    del g.input[:]
    g.input.extend(inputs)
    out = without_initializers(model)  # the source's fields (functions, metadata), its weights not copied
    out.graph.CopyFrom(g)
    out.graph.initializer.extend(t for t in model.graph.initializer if t.name not in small)  # the one weight copy
    del out.opset_import[:]
    out.opset_import.extend(converted.opset_import)
    out.ir_version = max(model.ir_version, min_ir)
    return out
