"""Running the GPU test files without pytest (tests/gpu/run_all.sh's fallback on a machine without pytest)."""

from __future__ import annotations

import time
from typing import Any


def run_plain(d: Any, runs: list[tuple[str, object, tuple]]) -> int:
    """Run ``(name, test, args)`` cases on ``d`` in order without pytest, one line each; 1 if any failed."""
    failures = 0
    for name, fn, args in runs:
        t0 = time.perf_counter()
        try:
            fn(d, *args)  # type: ignore[operator]
            print(f"ok   {name} ({time.perf_counter() - t0:.1f} s)", flush=True)
        except AssertionError as exc:
            failures += 1
            d.ptrs.clear()
            print(f"FAIL {name}: {exc}", flush=True)
    d.close()
    print(f"{len(runs) - failures} passed, {failures} failed")
    return 1 if failures else 0
