"""Shared fixtures. Tests build their models in code; nothing is downloaded.

Plain helpers live in ``tests/_support/trtforge_testing.py``: ``from trtforge_testing import assert_one_line_error``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from trtforge_testing import (  # noqa: F401  (re-exported)
    BASE_SEED,
    SEED_ENV,
    SHARED,
    CliResult,
    assert_one_line_error,
    run_console,
    seed_for,
)

_SEED_KEY = pytest.StashKey[int]()


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A NumPy generator seeded from ``$TRTFORGE_TEST_SEED`` (default fixed) and the test id; its seed is printed
    in the report of a failing test."""
    seed = seed_for(request.node.nodeid)
    request.node.stash[_SEED_KEY] = seed
    return np.random.default_rng(seed)


def pytest_report_header(config: pytest.Config) -> str:
    return f"trtforge test seed: {SEED_ENV}={BASE_SEED}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    seed = item.stash.get(_SEED_KEY, None)
    if seed is not None and report.failed:
        report.sections.append(("random seed", f"{SEED_ENV}={BASE_SEED} (this test's generator: seed {seed})"))
    return report


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
