"""Shared fixtures. Tests build their models in code; nothing is downloaded.

Plain helpers live in ``tests/_support/trtforge_testing.py``: ``from trtforge_testing import assert_one_line_error``.
"""

from __future__ import annotations

import os

import pytest

from trtforge_testing import SHARED, CliResult, assert_one_line_error, run_console  # noqa: F401  (re-exported)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run ``trtforge ARGS...`` in-process; returns exit code, stdout and stderr."""
    from trtforge.build_engine.cli import main

    def run(*argv: str | os.PathLike[str]) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in argv])
        cap = capsys.readouterr()
        return CliResult(code, cap.out, cap.err)

    return run
