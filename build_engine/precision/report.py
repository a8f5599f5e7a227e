"""What precision conversion reports: a typed record, written as the ``--report`` JSON by ``to_json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..passes.report import FoldReport


@dataclass(frozen=True)
class PrecisionReport:
    """``nodes_low`` / ``nodes_fp32`` / ``nodes_untouched``: nodes per decision; ``kept_fp32_ops``: kept nodes per
    op type; ``already``: nothing was float32 where the low type runs (the model came back as it was); ``fold``: the
    fold that followed, when one ran."""

    to: str
    nodes_low: int
    nodes_fp32: int
    nodes_untouched: int
    kept_fp32_ops: dict[str, int]
    casts_inserted: int
    initializers_converted: int
    plugin_nodes_low: int
    pool_inputs_converted: int
    already: bool = False
    fold: FoldReport | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Keys in field order; ``already`` only when true and ``fold`` only when one ran (as since format 1)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if (f.name == "already" and not value) or (f.name == "fold" and value is None):
                continue
            out[f.name] = asdict(value) if isinstance(value, FoldReport) else value
        return out
