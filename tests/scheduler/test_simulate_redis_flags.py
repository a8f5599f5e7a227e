"""``simulate``'s L2 flags without the L2 tier: exit 2 naming them (they were accepted and did nothing)."""

from __future__ import annotations

import pytest

from trtforge_testing import assert_one_line_error

BASE = ("simulate", "--trace", "synthetic:5", "--profile", "h100", "--model", "llama-3.1-8b", "--policy", "vllm-v1")


@pytest.mark.parametrize("extra, needles", [
    (("--redis-url", "redis://127.0.0.1:6379/0"), ("--redis-url", "--response-cache l1,l2")),
    (("--redis-pool-size", "64"), ("--redis-pool-size",)),
    (("--response-cache", "l1", "--redis-url", "redis://127.0.0.1:6379/0", "--redis-pool-size", "64"),
     ("--redis-url and --redis-pool-size", "drop them")),
    (("--response-cache", "l1,l2", "--redis-url", "redis://127.0.0.1:1/0", "--redis-pool-size", "8"),
     ("--redis-pool-size 8", "at least 32")),
])
def test_l2_flags_need_the_l2_tier(cli, extra: tuple[str, ...], needles: tuple[str, ...]) -> None:
    assert_one_line_error(cli(*BASE, *extra), 2, *needles)


def test_without_l2_flags_the_run_is_unchanged(cli) -> None:
    res = cli(*BASE)
    assert res.code == 0, res.err
