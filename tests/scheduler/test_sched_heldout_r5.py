"""Held-out QA round 5: the scheduler, the simulator and its CLI on inputs the other tests never used."""

from __future__ import annotations

import pytest

from trtforge_testing import assert_one_line_error


@pytest.mark.parametrize("cap", ["\u00b2", "\u0663", "\uff15"])
def test_max_tokens_of_non_ascii_digits_is_one_line_exit_2(cli, cap: str) -> None:
    """--max-tokens is plain ASCII digits: a superscript two crashed (exit 3, int() refused what isdigit()
    accepted), an Arabic-Indic or fullwidth digit was read as a cap of 3 or 5."""
    res = cli("simulate", "--trace", "synthetic:5", "--profile", "h100", "--model", "llama-3.1-8b",
              "--policy", "cache-aware", "--max-tokens", cap)
    assert_one_line_error(res, 2, "--max-tokens")
