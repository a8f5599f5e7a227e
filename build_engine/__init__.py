"""trtforge.build_engine: ONNX passes, precision, profiles, TensorRT backends, builder, Triton writer, diff and CLI.

Importing this package (or any trtforge module) must stay cheap: tensorrt, tensorrt_rtx, onnxruntime, polygraphy
and cuda are imported lazily inside the functions that need them.
"""

from __future__ import annotations

__all__ = ["__version__"]


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
