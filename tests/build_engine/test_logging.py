"""One ``trtforge`` logger: notes on stderr by default, ``--quiet`` keeps warnings and errors, ``--verbose`` adds
debug lines; every command and sub-command takes both flags."""

from __future__ import annotations

import logging

import pytest

from trtforge.build_engine.cli import COMMANDS
from trtforge.build_engine.core import log

SUBCOMMANDS = {"lora": ("inject", "decompose", "pack"), "cache": ("key", "ping", "invalidate")}


def _emit_all() -> None:
    lib = logging.getLogger("trtforge.tests.library")
    lib.debug("d-line")
    lib.info("i-line")
    lib.warning("w-line")


@pytest.mark.parametrize(("verbosity", "shown", "hidden"), [
    (log.NORMAL, ["note: i-line", "warning: w-line"], ["d-line"]),
    (log.QUIET, ["warning: w-line"], ["i-line", "d-line"]),
    (log.VERBOSE, ["debug: d-line", "note: i-line", "warning: w-line"], []),
])
def test_levels_and_prefixes(verbosity: int, shown: list[str], hidden: list[str],
                             capsys: pytest.CaptureFixture[str]) -> None:
    log.configure(verbosity)
    log.configure(verbosity)  # idempotent: still one line per record
    try:
        _emit_all()
        err = capsys.readouterr().err
    finally:
        log.configure(log.NORMAL)
    for line in shown:
        assert err.count(line) == 1, err
    for text in hidden:
        assert text not in err, err


@pytest.mark.parametrize("argv", [[name] for name in COMMANDS]
                         + [[name, sub] for name, subs in SUBCOMMANDS.items() for sub in subs])
def test_every_command_takes_verbose_and_quiet(argv: list[str], cli) -> None:
    res = cli(*argv, "--help")
    assert res.code == 0, res.err
    assert "--verbose" in res.out and "--quiet" in res.out, res.out


def test_quiet_and_verbose_together_are_refused(cli) -> None:
    res = cli("profiles", "--quiet", "--verbose")
    assert res.code == 2 and res.err.startswith("error: ") and "--verbose" in res.err, res.err


def test_top_level_flags_reach_the_command(cli) -> None:
    res = cli("--quiet", "profiles")
    assert res.code == 0, res.err
    assert logging.getLogger("trtforge").level == logging.WARNING
    res = cli("-v", "profiles")
    assert res.code == 0 and logging.getLogger("trtforge").level == logging.DEBUG, res.err
    log.configure(log.NORMAL)
