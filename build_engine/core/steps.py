"""Named steps of a command, timed, with a live spinner on stderr for the user (issue 18.7).

Library code wraps each step that can take more than a moment (load, save, convert, fold, check, inject, diff) in
``with step("load model"):``. Nothing is shown unless the CLI turned display on (``enable``): it does so when stderr
is a terminal, or with ``--progress``. Then a rich spinner on stderr names the running step (nested steps as
``outer > inner``) with its elapsed time, and each finished outermost step that took at least ``SHOW_AFTER`` seconds
leaves one line (``load model  3.2 s``). stdout is never written, so ``--json``/report output is unchanged.

Timing is always on and costs one ``perf_counter`` per step: ``elapsed()`` is the time since the command started
(``start``), which commands print as their duration so that it covers load and save too.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

SHOW_AFTER = 1.0  # seconds: finished steps shorter than this leave no line

_state: dict[str, Any] = {"show": False, "status": None, "stack": [], "t0": time.perf_counter(), "console": None}


def start(show: bool) -> None:
    """Called once per command by the CLI: reset the clock; ``show`` turns the spinner on."""
    _state.update(show=show, status=None, stack=[], t0=time.perf_counter(), console=None)


def should_show(flag: bool) -> bool:
    """Display when asked (``--progress``) or when stderr is a terminal."""
    return flag or sys.stderr.isatty()


def elapsed() -> float:
    """Seconds since ``start``: the whole command so far."""
    return time.perf_counter() - float(_state["t0"])


def _console() -> Any:
    if _state["console"] is None:
        from rich.console import Console

        _state["console"] = Console(stderr=True, highlight=False, soft_wrap=True)
    return _state["console"]


def _plain(text: str) -> str:
    """Labels carry file names: escaped so a '[red]' in a name shows as written, not as rich markup."""
    from rich.markup import escape

    return escape(text)


@contextlib.contextmanager
def step(label: str) -> Iterator[None]:
    """Time (and, when display is on, show) one step; see the module docstring."""
    stack: list[str] = _state["stack"]
    stack.append(label)
    t0 = time.perf_counter()
    status = None
    try:
        if _state["show"]:
            text = _plain(" > ".join(stack))
            if _state["status"] is None:
                status = _console().status(f"{text} ...", spinner="dots")
                status.start()
                _state["status"] = status
            else:
                _state["status"].update(f"{text} ...")
        yield
    finally:
        stack.pop()
        dt = time.perf_counter() - t0
        if status is not None:
            status.stop()
            _state["status"] = None
            if dt >= SHOW_AFTER:
                _console().print(f"[dim]{_plain(label)}[/dim]  {dt:.1f} s")
        elif _state["status"] is not None and stack:
            _state["status"].update(f"{_plain(' > '.join(stack))} ...")


_F = TypeVar("_F", bound=Callable[..., Any])


def timed(label: str) -> Callable[[_F], _F]:
    """Decorator: run the function as ``step(label)``."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with step(label):
                return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap
