"""Flag bounds shared by several commands, stated once: a value outside them is exit 2 naming the flag and the
limit, before any work (issue 11, "Exit codes and bounds")."""

from __future__ import annotations

from ..core.errors import InputError

#: Seeds feed NumPy's SeedSequence and onnxruntime's random fills, which both take 0 .. 2**32 - 1.
MAX_SEED = 2**32 - 1


def check_seed(value: int, flag: str = "--seed") -> int:
    if not 0 <= value <= MAX_SEED:
        raise InputError(f"{flag} {value}: give a whole number from 0 to {MAX_SEED}")
    return value


def check_range(flag: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InputError(f"{flag} {value}: give a whole number from {low} to {high}")
    return value
