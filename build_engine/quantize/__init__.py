"""Post-training quantization to explicit Q/DQ ONNX that TensorRT strongly typed networks build.

Modes: ``int8`` (SmoothQuant W8A8: per-channel int8 weights, per-tensor int8 activations), ``int4-wo`` (weight-only,
int4 blocks along the input dim, AWQ-style scale search or round-to-nearest) and ``fp8`` (E4M3 weights per channel
and activations per tensor). What stays float is decided by the precision policy (``precision.policy``) plus the LM
head and ``--exclude``; LoRA plugin nodes and their pools are never touched. One module per concern: ``config``,
``targets`` (selection), ``calib_data`` (samples), ``calibrators`` (onnxruntime statistics and ranges),
``smoothquant``, ``awq``, ``numerics``, ``qdq`` (graph rewrite), ``report``, ``quantizer`` (the steps in order).
Layer: imports passes, precision, plugins, verify's input planner, and core.
"""

from .calib_data import CalibSet, generate, load_npz
from .config import METADATA_KEY, MODES, QuantConfig
from .quantizer import QuantResult, quantize

__all__ = ["METADATA_KEY", "MODES", "CalibSet", "QuantConfig", "QuantResult", "generate", "load_npz", "quantize"]
