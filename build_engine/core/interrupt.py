"""SIGINT / SIGTERM: cancel a command at a safe point, never in the middle of a commit.

``handling()`` (entered by the CLI around every command) installs handlers for SIGINT and SIGTERM. Outside a
``deferred()`` block a signal raises ``Interrupted`` at once (Python runs handlers between bytecodes of the main
thread), so every ``with`` block on the way out removes its staging folder. Inside ``deferred()`` (a commit's
renames; TensorRT's build, whose callbacks would swallow an exception: "Exception caught in log()") the signal is
only recorded and raised when the block ends. A signal while a module is imported is raised just after the import
(``_in_import``; SIGALRM retries every 20 ms): raised into a C extension's initialisation it aborts the process.
The console entry holds signals the same way from its start (``early()``), before a command's ``handling()``.

TensorRT runs its build in C++ and may call the progress monitor from another thread, where Python signal handlers
never run; so the handlers also arm ``signal.set_wakeup_fd``, whose byte the C-level handler writes at once, and
``pending()`` (what the monitor's ``step_complete`` asks) reads it from any thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
_state: dict[str, Any] = {"depth": 0, "signum": None, "rfd": None}
_lock = threading.Lock()


class Interrupted(KeyboardInterrupt):
    """The command was asked to stop by a signal; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = EXIT_CODES.get(signal.Signals(signum), 128 + signum)


def _handler(signum: int, frame: FrameType | None) -> None:
    _state["signum"] = signum
    if _state["depth"] == 0:
        if _in_import(frame):
            _retry_soon()
            return
        raise Interrupted(signum)


def _in_import(frame: FrameType | None) -> bool:
    """Whether the main thread is importing a module. An exception raised into a C extension's initialisation
    aborts the process (onnx's pybind11 module, making its enums, died of SIGABRT / SIGSEGV on a Ctrl-C) or turns
    into an ImportError (numpy); so a signal there is raised once the import is done (``_retry_soon``)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


_RETRY_S = 0.02


def _retry_soon() -> None:
    if not _state.get("armed"):
        _state.update(armed=True, alarm=signal.signal(signal.SIGALRM, _retry))
    signal.setitimer(signal.ITIMER_REAL, _RETRY_S)


def _retry(signum: int, frame: FrameType | None) -> None:
    if _in_import(frame):
        signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
        return
    _stop_retry()
    if _state["signum"] is not None and _state["depth"] == 0:
        raise Interrupted(int(_state["signum"]))


def _stop_retry() -> None:
    """Cancel a pending retry and give SIGALRM its handler back."""
    if _state.pop("armed", False):
        signal.setitimer(signal.ITIMER_REAL, 0)
        previous = _state.pop("alarm", None)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


def pending() -> int | None:
    """The signal received so far (from any thread, also while the main thread is inside C++), or None."""
    rfd = _state["rfd"]
    if rfd is not None:
        with _lock, contextlib.suppress(OSError):
            for byte in os.read(rfd, 64):
                if byte in EXIT_CODES:  # the pipe also carries any other signal that has a Python handler
                    _state["signum"] = byte
    signum: int | None = _state["signum"]
    return signum


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold signals until the block ends (then raise ``Interrupted``); for steps that must not stop half-way.

    A resource a block must remove (a staging folder, a lock file) is made inside ``deferred()`` *within* the
    ``try`` whose ``finally`` removes it: made outside, a signal in the instant between its creation and the
    ``try`` left it behind (a SIGTERM 20 ms into ``fold`` left ``.trtforge-staging``)."""
    hold()
    try:
        yield
    except BaseException:
        _state["depth"] -= 1
        raise
    release()


def hold() -> None:
    """Start holding signals (as ``deferred()`` does) until the matching ``release()``."""
    _state["depth"] += 1


def release() -> None:
    """End one ``hold()``; raise ``Interrupted`` if a signal came and nothing holds now."""
    _state["depth"] = max(0, _state["depth"] - 1)
    if _state["depth"] == 0 and _state["rfd"] is not None and pending() is not None:
        raise Interrupted(int(_state["signum"]))


def check() -> None:
    """Raise ``Interrupted`` if a signal arrived (for loops in C-heavy code where handlers run late)."""
    signum = pending()
    if signum is not None and _state["depth"] == 0:
        raise Interrupted(signum)


@contextlib.contextmanager
def early(held: list[int] | None = None) -> Iterator[None]:
    """For the console entry, before a command's ``handling()``: SIGINT/SIGTERM raise ``Interrupted`` (Python's
    default printed a KeyboardInterrupt traceback while the command module was imported or its parser built, and a
    SIGTERM killed the process without a word); main thread only, restored after. ``held``: signals recorded before
    this point (the package's own import in the console script), raised at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["signum"] = None
    old = {s: signal.signal(s, _handler) for s in EXIT_CODES}
    try:
        if held:
            _state["signum"] = held[0]
            raise Interrupted(held.pop(0))
        yield
    finally:
        _stop_retry()
        _state["signum"] = None
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """Install the SIGINT/SIGTERM handlers for the block (main thread only; elsewhere a no-op), then restore."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    old = {s: signal.signal(s, _handler) for s in EXIT_CODES}
    old_fd = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    _state.update(depth=0, rfd=rfd)  # a signal early() held during an import stays pending (its retry is set)
    try:
        yield
    except Exception as exc:
        # A signal's Interrupted that a library turned into its own error (numpy's import, interrupted, raises
        # ImportError '_multiarray_umath failed to import': exit 3 'internal error' for a SIGTERM) is the signal.
        signum = pending()
        if signum is not None:
            raise Interrupted(signum) from exc
        raise
    finally:
        _stop_retry()
        signal.set_wakeup_fd(old_fd)
        for s, h in old.items():
            signal.signal(s, h)
        _state.update(depth=0, signum=None, rfd=None)
        os.close(rfd)
        os.close(wfd)
