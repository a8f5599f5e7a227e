"""The one ``trtforge`` logger. Library modules log through ``logging.getLogger("trtforge.<module>")`` (or
``__name__``, which is under it) and never print; the CLI calls ``configure`` once per command.

On stderr each record is one line prefixed by its level as the CLI has always written it: ``note:`` (info),
``warning:``, ``error:`` and, with ``--verbose``, ``debug:``. ``--quiet`` keeps warnings and errors only.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "trtforge"
QUIET, NORMAL, VERBOSE = -1, 0, 1
_LEVELS = {QUIET: logging.WARNING, NORMAL: logging.INFO, VERBOSE: logging.DEBUG}
_PREFIX = {logging.DEBUG: "debug", logging.INFO: "note", logging.WARNING: "warning", logging.ERROR: "error",
           logging.CRITICAL: "error"}


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = f"{_PREFIX.get(record.levelno, record.levelname.lower())}: {record.getMessage()}"
        if record.exc_info and logging.getLogger(LOGGER_NAME).isEnabledFor(logging.DEBUG):
            text += "\n" + self.formatException(record.exc_info)
        return text


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at emit time (pytest's capture, a redirect made after ``configure``)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def logger(name: str = "") -> logging.Logger:
    """``trtforge`` or ``trtforge.<name>``."""
    return logging.getLogger(f"{LOGGER_NAME}.{name}" if name else LOGGER_NAME)


def configure(verbosity: int = NORMAL) -> logging.Logger:
    """Route the ``trtforge`` logger to stderr at the level ``verbosity`` selects; idempotent (one handler)."""
    root = logging.getLogger(LOGGER_NAME)
    for h in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(h)
    handler = _StderrHandler()
    handler.setFormatter(_Format())
    root.addHandler(handler)
    root.setLevel(_LEVELS[max(QUIET, min(VERBOSE, verbosity))])
    # Our handler prints; the root logger's handlers (an application's, pytest's caplog) still see the records.
    root.propagate = True
    return root
