"""Shared CLI plumbing: the exit-code contract (0 ok, 1 check failed, 2 bad input, 3 internal error) and one-line
errors.

Every command builds its parser with ``make_parser`` and runs through ``run_command``, which turns a
``TrtforgeError`` into ``error: <message>`` on stderr and its exit code, hides tracebacks unless ``--debug``, and
reports unexpected exceptions as internal errors (exit 3, never 1, which means "a check ran and failed") with how
to report them. A closed stdout (``| head``) propagates as BrokenPipeError to the console entry, which exits quietly.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..core.errors import InputError, TrtforgeError
from ..core.steps import SHOW_AFTER

#: Exit code of an unexpected exception (a bug in trtforge or a library), distinct from 1 (a check failed).
INTERNAL_ERROR = 3


class UsageError(InputError):
    """Bad command-line usage."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error raises ``UsageError`` (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}; see '{self.prog} --help'")

    def _print_message(self, message: str, file: Any = None) -> None:
        """As argparse's, but a failed write is raised, not ignored: ``trtforge fold --help > /dev/full`` (or into a
        closed pipe) exited 0 having written nothing."""
        if message:
            try:
                (file or sys.stderr).write(message)
            except BrokenPipeError:
                raise
            except OSError as exc:
                raise StdoutError(exc.errno, exc.strerror) from exc


class StdoutError(OSError):
    """Help or usage text could not be written (stdout on a full disk): the console entry says so, exit 2."""


_PROGRESS_HELP = (f"show on stderr each step that took {SHOW_AFTER:g} s or more, with its time, even when stderr is "
                  "not a terminal (on a terminal this is on, and a spinner names every step while it runs)")


def make_parser(prog: str, description: str) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=description)
    add_debug(parser)
    return parser


def add_debug(parser: argparse.ArgumentParser) -> None:
    """The options every command and sub-command (e.g. ``trtforge lora inject``) has: ``--debug``, ``--progress``,
    ``--verbose`` / ``--quiet``."""
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--progress", action="store_true", help=_PROGRESS_HELP)
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument("-v", "--verbose", action="store_true", help="also log debug messages on stderr")
    talk.add_argument("-q", "--quiet", action="store_true", help="log only warnings and errors on stderr (no notes)")


FILE_FORCE_HELP = ("accepted by every command that writes, so one spelling works everywhere: an existing output "
                   "FILE is replaced (atomically) with or without it, an output FOLDER (build, triton) only with it; "
                   "an input is never overwritten or deleted, with or without it")


def add_file_force(parser: argparse.ArgumentParser) -> None:
    """``--force`` on a command whose outputs are files (see ``FILE_FORCE_HELP``)."""
    parser.add_argument("--force", action="store_true", help=FILE_FORCE_HELP)


def fail(message: str) -> NoReturn:
    raise InputError(message)


def run_command(parser: argparse.ArgumentParser, handler: Callable[[Any], int | None],
                argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help
            return int(exc.code or 0)
        from ..core import env, interrupt, log, steps

        env.check_all()  # a bad TRTFORGE_* value is exit 2 naming it, before anything runs

        log.configure(log.VERBOSE if getattr(args, "verbose", False) else
                      log.QUIET if getattr(args, "quiet", False) else log.NORMAL)

        # Steps (load, convert, fold, check, save...) show on stderr on a terminal or with --progress; --no-progress
        # (build) turns them off with TensorRT's bars.
        steps.start(steps.should_show(bool(getattr(args, "progress", False)))
                    and not getattr(args, "no_progress", False))
        with interrupt.handling():  # SIGINT/SIGTERM -> Interrupted at a safe point, never inside a commit
            return int(handler(args) or 0)
    except TrtforgeError as exc:
        if debug:
            traceback.print_exc()
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except (BrokenPipeError, StdoutError):  # the reader of stdout left (| head), or stdout is full: main says so
        raise
    except KeyboardInterrupt as exc:  # core.interrupt.Interrupted (SIGINT 130, SIGTERM 143) or a plain Ctrl-C
        name = getattr(exc, "signum", None)
        how = f" by {signal_name(name)}" if name else ""
        print(f"error: interrupted{how}; no partial output was left", file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))
    except OSError as exc:  # a full disk, a read-only folder, a name too long...: the machine's state, not a bug
        from ..core.oserrors import describe

        if debug:
            traceback.print_exc()
        line = describe(exc)
        if line is None:
            return _internal(exc)
        print(f"error: {line}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug in trtforge or a library: one line unless --debug
        if debug:
            traceback.print_exc()
        loop = _symlink_loop(exc)
        if loop is not None:
            print(f"error: {loop}: too many levels of symbolic links; fix the link or give the real path",
                  file=sys.stderr)
            return 2
        if type(exc) is ValueError and str(exc) == "embedded null byte":  # os calls refuse such a path
            print("error: a path read from an input file contains a NUL character, which no file name can hold; "
                  "remove it from the file (rerun with --debug for where it was read)", file=sys.stderr)
            return 2
        return _internal(exc)


def _symlink_loop(exc: BaseException) -> str | None:
    """The path of pathlib's ``RuntimeError('Symlink loop from PATH')`` (``Path.resolve()`` before Python 3.13, which
    raises OSError ELOOP instead): a link loop the user gave (``ln -s L L; trtforge build-matrix L``), not a bug."""
    text = str(exc)
    prefix = "Symlink loop from "
    if type(exc) is RuntimeError and text.startswith(prefix):
        return text[len(prefix):].strip("'")
    return None


def _internal(exc: BaseException) -> int:
    text = " ".join(str(exc).split())[:300]
    print(f"error: internal error: {type(exc).__name__}: {text} (a bug: rerun with --debug and report the "
          "traceback at the trtforge issue tracker)", file=sys.stderr)
    return INTERNAL_ERROR


def signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


def stdout_console() -> Any:
    """A rich Console on stdout (imported lazily)."""
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    # rich's default turns a closed stdout into SystemExit(1) ("failed"); hand it to the console entry instead,
    # which exits quietly with the SIGPIPE status like every other command.
    console.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]
    return console


def _broken_pipe() -> None:
    raise BrokenPipeError(32, "Broken pipe")


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)
