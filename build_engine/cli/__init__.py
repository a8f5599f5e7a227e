"""The ``trtforge`` console script: a thin dispatcher over one module per command.

Command modules are imported only when their command runs, so ``trtforge --help`` stays fast and imports no
TensorRT, onnxruntime, polygraphy or cuda. Each command module exposes ``main(argv) -> int``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence

# name -> (module under trtforge.build_engine.cli, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "fold": ("fold", "exact Cast/Identity folding (never changes an output bit but a NaN's payload)"),
    "precision": ("precision", "convert a model to fp16/bf16, keeping sensitive ops in fp32, then fold"),
    "quantize": ("quantize", "quantize to int8 (SmoothQuant W8A8), int4 weight-only (AWQ) or fp8 as explicit Q/DQ"),
    "lora": ("lora", "inject / decompose LoRAOpPluginDynamic nodes; pack PEFT adapters into slot pools"),
    "profiles": ("profiles", "list GPU profiles or show one"),
    "backends": ("backends", "show the TensorRT backends found and what they can target"),
    "build": ("build", "build a TensorRT engine for a GPU profile (model.plan + manifest.json)"),
    "build-matrix": ("build_matrix", "build many models x GPU profiles, locally or on a Ray cluster, cached"),
    "cache": ("cache", "response cache: a request's key, Redis reachability, invalidation after a deploy"),
    "kv-plan": ("kv_plan", "KV-cache capacity of a decoder on a GPU profile"),
    "triton": ("triton", "write or check a Triton model repository entry from an engine folder"),
    "diff": ("diff", "compare two models' outputs through Polygraphy (exit 1 on mismatch)"),
    "simulate": ("simulate", "replay a request trace against the KV-aware scheduler"),
    "demo": ("demo", "run the whole pipeline on the bundled example model"),
}


def _help() -> str:
    from .. import __version__

    width = max(len(n) for n in COMMANDS)
    lines = [
        f"usage: trtforge [--version] [--debug] [--verbose|--quiet] COMMAND [ARGS...]   (trtforge {__version__})",
        "",
        "Distilled transformer ONNX -> TensorRT engines for A10 / A100 / L40S / H100.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += [
        "",
        "options:",
        "  --version  print the version and exit",
        "  --debug    show tracebacks on errors",
        "  --verbose  also log debug messages (every command has -v/--verbose and -q/--quiet)",
        "  --quiet    log only warnings and errors",
        "",
        "Run 'trtforge COMMAND --help' for a command's options. Exit codes: 0 ok, 1 a check failed, 2 bad input, "
        "3 internal error (a bug: please report it).",
    ]
    return "\n".join(lines)


#: Exit code after stdout's reader left (``trtforge ... | head -1``): what a Unix tool killed by SIGPIPE reports.
BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """The console entry: ``_main`` plus a quiet exit when stdout is a closed pipe (no traceback, no message)."""
    from .. import HELD_SIGNALS
    from ..core import interrupt

    _open_standard_streams()
    code = None
    stderr = sys.stderr
    sys.stderr = _Tolerant(stderr)  # type: ignore[assignment]
    try:
        with interrupt.early(HELD_SIGNALS):  # a signal before the command's own handlers: one line, 130 / 143
            code = _main(argv)
        sys.stdout.flush()  # inside the try: a late EPIPE on the final flush is the same case
        return code
    except KeyboardInterrupt as exc:
        from ._common import signal_name

        signum = getattr(exc, "signum", None)
        print(f"error: interrupted{f' by {signal_name(signum)}' if signum else ''}; no partial output was left",
              file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))
    except BrokenPipeError:
        _drop_stdout()
        return BROKEN_PIPE
    except OSError as exc:  # stdout on a full disk (> /dev/full): --version's print or the final flush
        _drop_stdout()
        if code:  # the command failed and said so; its unflushed output is what could not be written
            return code
        print(f"error: cannot write to stdout ({exc.strerror or exc}); free space where stdout goes or redirect it",
              file=sys.stderr)
        return 2
    finally:
        sys.stderr = stderr
        _done()


def _done() -> None:
    """In the console script, a signal after the command ended changes nothing: its outputs are complete (or were
    never written) and its exit code stands. Ignored, it cannot kill the interpreter's exit by SIGINT/SIGTERM."""
    import signal
    import threading

    from .. import CONSOLE

    if CONSOLE and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


class _Tolerant:
    """``sys.stderr`` whose write errors are dropped (``2>/dev/full``, a closed terminal): a note, a progress line
    or the error line itself that cannot be shown must not change what the command does (a fold with --progress
    wrote nothing and exited 1; a missing input exited 1, not 2)."""

    def __init__(self, stream: object) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))  # type: ignore[attr-defined]
        except OSError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _open_standard_streams() -> None:
    """Put /dev/null on a closed stdin, stdout or stderr (``trtforge ... >&-``, a daemon without streams). Python
    leaves ``sys.stdout``/``sys.stderr`` None there (a print to stderr then raised AttributeError: exit 3, nothing
    written), and the next file opened would take the free descriptor: TensorRT's or onnxruntime's C++ output on fd
    1 or 2 would land inside a plan or a model being written."""
    import os

    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False, encoding="utf-8",  # noqa: SIM115
                                    errors="backslashreplace"))
    # A path the output encoding cannot spell (PYTHONIOENCODING=ascii, a C locale without UTF-8) is escaped, as
    # stderr does: a summary line naming 'ö.onnx' raised UnicodeEncodeError after the model was written (exit 3).
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's own flush at exit does not raise again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (captured in tests)
        pass


def _main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = False
    talk: list[str] = []
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt in ("-h", "--help"):
            print(_help())
            return 0
        if opt == "--version":
            from .. import __version__

            print(f"trtforge {__version__}")
            return 0
        if opt == "--debug":
            debug = True
            continue
        if opt in ("-v", "--verbose", "-q", "--quiet"):  # passed on to the command, which configures logging
            talk.append(opt)
            continue
        print(f"error: unknown option {opt!r}; see 'trtforge --help'", file=sys.stderr)
        return 2
    if not args:
        print(_help(), file=sys.stderr)
        return 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        print(f"error: unknown command {name!r}; {hint}see 'trtforge --help'", file=sys.stderr)
        return 2
    import importlib

    try:
        module = importlib.import_module(f"trtforge.build_engine.cli.{COMMANDS[name][0]}")
    except ImportError as exc:  # an optional dependency of this command is missing
        from ..core import interrupt

        if interrupt.pending() is not None:  # a signal inside the import (numpy turns it into ImportError)
            raise interrupt.Interrupted(int(interrupt.pending() or 0)) from exc
        if debug:
            raise
        print(f"error: 'trtforge {name}' cannot start: {exc}; install trtforge with its extras "
              "(pip install 'trtforge[all]')", file=sys.stderr)
        return 2
    if debug and "--debug" not in rest:
        rest = ["--debug", *rest]
    rest = [*talk, *rest]
    return int(module.main(rest))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
