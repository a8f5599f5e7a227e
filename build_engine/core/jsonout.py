"""JSON as the standard defines it: no NaN or Infinity tokens (``json.dumps`` writes them by default, and most
JSON readers other than Python's refuse them). A non-finite float is written as the string ``"inf"``, ``"-inf"``
or ``"nan"`` (``float()`` reads each back), not as ``null``: an infinite relative error (reference 0, actual
nonzero) or an overflowed maximum is a result, not a missing value. A value the writer means as missing is ``None``
before it gets here (``null``). Every writer dumps with ``allow_nan=False`` so a new one cannot slip through;
files another library writes (Polygraphy's results) are rewritten the same way by ``standardize_file``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: How a non-finite float is written (``float(s)`` reads each back).
NON_FINITE = {math.inf: "inf", -math.inf: "-inf"}


class DuplicateKey(ValueError):
    """A JSON object that gives one key twice (``unique_keys``)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for the JSON files a user gives: a key given twice in one object is refused (Python's
    reader keeps the last value, others the first or either; the file does not say which it means)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"key {key!r} is given twice in one object")
        out[key] = value
    return out


def unreadable(exc: ValueError | RecursionError) -> str:
    """Why ``json.loads`` refused a text that is not a syntax error: nesting past Python's stack (RecursionError),
    a key given twice (``unique_keys``) or an integer of over 4300 digits (int()'s limit, a ValueError)."""
    if isinstance(exc, DuplicateKey):
        return str(exc)
    return "nested too deeply" if isinstance(exc, RecursionError) else "an integer of more than 4300 digits"


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, +-Infinity) replaced by ``"nan"`` / ``"inf"`` / ``"-inf"``,
    recursively (dict keys stay as they are)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else NON_FINITE.get(obj, "nan")
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``finite(obj)`` with ``allow_nan=False``."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def standardize_file(path: Path, indent: int = 4) -> None:
    """Rewrite the JSON file ``path`` (written by another library, e.g. Polygraphy's ``save``, which writes bare
    ``NaN`` / ``Infinity`` tokens) in standard JSON, as ``dumps`` writes it; a file without such tokens is left as
    it is, byte for byte."""
    seen: list[str] = []

    def constant(token: str) -> float:
        seen.append(token)
        return float(token.replace("Infinity", "inf"))

    obj = json.loads(path.read_text(encoding="utf-8"), parse_constant=constant)
    if seen:
        path.write_text(dumps(obj, indent=indent), encoding="utf-8")
