"""What ``fold`` reports: a typed record, written as the ``--report`` JSON by ``to_json`` (keys in field order)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class FoldReport:
    """``removed`` / ``added``: node count per op type; ``rules``: rewrites per pass (``GraphPass.name``)."""

    nodes_before: int
    nodes_after: int
    removed: dict[str, int]
    added: dict[str, int]
    rules: dict[str, int]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
