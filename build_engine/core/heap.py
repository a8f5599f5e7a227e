"""Give memory that C/C++ code freed back to the operating system (glibc's ``malloc_trim``).

onnx's C++ shape inference of a 100k-node graph allocates and frees about 90 MB of C heap. glibc keeps freed heap
pages for later ``malloc`` calls, but Python's object allocator takes its memory in separate mmap'd arenas, so it
cannot reuse them: without a trim, the pages of the inference and of the Python objects built afterwards add up in
the process's peak resident set. Elsewhere than glibc (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import lru_cache


@lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def release_free_heap() -> None:
    """Return the C heap's free pages to the OS (cheap: milliseconds for hundreds of MB)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
