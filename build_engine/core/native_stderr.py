"""Hold what native code writes straight to file descriptor 2 (C++ ``std::cerr``) during a call.

TensorRT's ONNX parser prints some failures itself (``Unsupported ONNX data type: INT16 (5)``) before it returns
its error, so a refused model printed that line above the command's one ``error:`` line. ``held()`` points fd 2 at a
temporary file for the call; on leaving, what was written goes to stderr as before unless the caller set ``keep``
to False, and ``lines`` holds its non-empty lines (for the caller's one error line). Without a usable fd 2 (closed
stderr) nothing is held.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class Held:
    def __init__(self) -> None:
        self.keep = True
        self.lines: list[str] = []


@contextmanager
def held() -> Iterator[Held]:
    out = Held()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2: nothing to hold
        yield out
        return
    with tempfile.TemporaryFile() as tmp:
        try:
            sys.stderr.flush()
            os.dup2(tmp.fileno(), 2)
            yield out
        finally:
            with suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read()
            out.lines = [" ".join(ln.split()) for ln in data.decode(errors="replace").splitlines() if ln.strip()]
            if out.keep and data:
                with suppress(OSError):
                    os.write(2, data)
