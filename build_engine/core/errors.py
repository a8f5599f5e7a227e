"""One error hierarchy for trtforge. Every error carries the exit code the CLI returns and a message that names the
file or setting at fault and what to do about it (the exit-code contract of
build_engine/cli/_common.py).

Raise with ``from`` so ``--debug`` shows the cause.
"""

from __future__ import annotations


class TrtforgeError(Exception):
    """Base class. ``exit_code`` 2 means bad input or usage; 1 means a check ran and failed."""

    exit_code: int = 2

    def __init__(self, message: str) -> None:
        # The CLI prints exactly one line: keep messages single-line.
        super().__init__(" ".join(message.split()))

    @property
    def message(self) -> str:
        return str(self)


class InputError(TrtforgeError):
    """A file or argument is wrong: missing, unreadable, not ONNX, unsafe, or inconsistent."""


class ModelError(InputError):
    """The ONNX model is malformed (truncated, cyclic, dangling inputs, bad external data)."""


class ProfileError(InputError):
    """A GPU profile is unknown or invalid."""


class BackendError(TrtforgeError):
    """No TensorRT backend can do what was asked (not installed, cannot target the profile's GPU)."""


class BuildError(TrtforgeError):
    """TensorRT failed to parse or build the network."""

    exit_code = 1


class CheckFailed(TrtforgeError):
    """A verification ran and failed (outputs differ, config invalid after writing)."""

    exit_code = 1
