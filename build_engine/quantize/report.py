"""The quantization report (``--report R.json``) and the summary stored in the model for ``trtforge build``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from ..passes.report import FoldReport
from .targets import Excluded


@dataclass(frozen=True)
class NodeReport:
    """One quantized projection: its weight, the activation edge it reads, and the scale facts."""

    name: str
    weight: str
    shape: tuple[int, int]
    activation: str
    act_amax: float | None       # per-tensor range of the (migrated) activation; None for weight-only
    migration: str               # "smoothquant alpha=0.5", "awq alpha=0.40 (calibration rel. error 0.0713, rtn
    #                              0.173)" (of the written weights, on the calibration rows), or "none"
    block_size: int | None = None  # int4: rows per block actually used (may be below --block-size, see quantizer)


@dataclass(frozen=True)
class QuantReport:
    mode: str
    calibration: str             # where the samples came from (file or generated, with seed and shapes)
    calibrator: str | None       # None for int4-wo (no activation ranges)
    alpha: float | None
    block_size: int | None
    int4_method: str | None
    nodes: tuple[NodeReport, ...]
    excluded: tuple[Excluded, ...]
    opset: int
    seconds: float
    fold: FoldReport

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["quantized"] = len(self.nodes)
        return out

    def metadata(self) -> str:
        """The model-embedded summary (``trtforge build`` copies it into the manifest)."""
        return json.dumps({"mode": self.mode, "calibration": self.calibration, "calibrator": self.calibrator,
                           "quantized": len(self.nodes), "excluded": [e.name for e in self.excluded]})
