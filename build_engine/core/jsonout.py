"""JSON as the standard defines it: no NaN or Infinity tokens (``json.dumps`` writes them by default, and most
JSON readers other than Python's refuse them). Non-finite floats become ``null``; every writer dumps with
``allow_nan=False`` so a new one cannot slip through."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, +-Infinity) replaced by None, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``finite(obj)`` with ``allow_nan=False``."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
