"""trtforge.build_engine: ONNX passes, precision, profiles, TensorRT backends, builder, Triton writer, diff and CLI.

Importing this package (or any trtforge module) must stay cheap: tensorrt, tensorrt_rtx, onnxruntime, polygraphy
and cuda are imported lazily inside the functions that need them.
"""

from __future__ import annotations

import os as _os
import sys as _sys

__all__ = ["__version__"]

#: Signals (SIGINT, SIGTERM) that reached the console script before its command's handlers existed.
HELD_SIGNALS: list[int] = []


def _hold(signum: int, frame: object) -> None:
    HELD_SIGNALS.append(signum)


def _is_console() -> bool:
    """Whether this process is the ``trtforge`` console script (its ``sys.argv[0]``)."""
    return bool(_sys.argv) and _os.path.basename(_sys.argv[0]) in ("trtforge", "trtforge.exe")


def _hold_signals() -> None:
    """The console script's first trtforge code: from here a Ctrl-C or SIGTERM is held, not raised, until
    ``cli.main`` turns it into ``error: interrupted`` and 130 / 143 (Python's default printed a KeyboardInterrupt
    traceback from inside an import, or a SIGTERM killed the process without a word). Only in the console script:
    a program that imports trtforge keeps its own handlers. Before this line the interpreter itself is starting
    (about 20-30 ms: its ``site`` import), where a signal still has Python's default effect."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and CONSOLE:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _hold)


#: Whether this process is the console script (``cli.main`` then also ignores signals once its command is done:
#: the interpreter's exit, which resets Python handlers to the default, took a late Ctrl-C as death by SIGINT).
CONSOLE = _is_console()
_hold_signals()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trtforge")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0+unknown"


def __getattr__(name: str) -> str:
    # Read on first use, not at import: importlib.metadata took most of the console script's start-up, before its
    # signal handlers exist (a Ctrl-C there printed a KeyboardInterrupt traceback).
    if name == "__version__":
        return _version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
