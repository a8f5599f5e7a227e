"""A password in the Redis URL (``redis://:PASSWORD@host``, as the login error itself advises, or ``?password=``)
never reaches a message: ``cache ping``'s answer and errors, ``simulate``'s start-up check and the L2 tier's
outage warning printed the URL as given, credential included. Against a real redis-server with ``requirepass``."""

from __future__ import annotations

import logging

import pytest

from trtforge.build_engine.cli import main
from trtforge.scheduler.cache.entry import CacheConfig
from trtforge.scheduler.cache.front import ResponseCache
from trtforge_testing import CliResult, assert_one_line_error, seeded_rng

from .conftest import _free_port, start_redis


def _secret(label: str) -> str:
    return seeded_rng(f"test_redis_url_secret_r7.{label}").bytes(12).hex()


def _ping(capsys: pytest.CaptureFixture[str], url: str) -> CliResult:
    code = main(["cache", "ping", "--redis-url", url])
    out, err = capsys.readouterr()
    return CliResult(code, out, err)


def test_cache_ping_never_prints_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    good, wrong = _secret("good"), _secret("wrong")
    server = start_redis(None, "--requirepass", good)
    try:
        ok = _ping(capsys, f"redis://:{good}@127.0.0.1:{server.port}/0")
        assert ok.code == 0 and good not in ok.out + ok.err and ":***@127.0.0.1" in ok.out, ok
        res = _ping(capsys, f"redis://:{wrong}@127.0.0.1:{server.port}/0")
        assert_one_line_error(res, 2, "refused the login")
        assert wrong not in res.err, res.err
        res = _ping(capsys, f"redis://127.0.0.1:{server.port}/0?password={wrong}")
        assert_one_line_error(res, 2, "password=***")
        assert wrong not in res.err, res.err
    finally:
        server.stop()
    res = _ping(capsys, f"redis://user:{good}@127.0.0.1:{_free_port()}/0")  # nothing listens there
    assert_one_line_error(res, 2, "cannot reach Redis", "user:***@")
    assert good not in res.err, res.err


def test_simulate_redis_check_never_prints_the_password() -> None:
    from trtforge.build_engine.core.errors import InputError
    from trtforge.scheduler.sim.cache_costs import check_redis

    secret = _secret("sim")
    with pytest.raises(InputError) as err:
        check_redis(f"redis://:{secret}@127.0.0.1:{_free_port()}/0")
    assert secret not in str(err.value) and ":***@" in str(err.value), err.value


def test_l2_outage_warning_never_logs_the_password(caplog: pytest.LogCaptureFixture) -> None:
    secret = _secret("l2")
    caplog.set_level(logging.WARNING, logger="trtforge.scheduler.cache")
    cache = ResponseCache(CacheConfig(layers=("l1", "l2"), redis_url=f"redis://:{secret}@127.0.0.1:{_free_port()}/0"),
                          engine_sha="e")
    try:
        req = {"model": "m", "messages": [{"role": "user", "content": "Which plan fits a team of five?"}],
               "temperature": 0}
        assert cache.serve(req, lambda _r: "the team plan")[0] == "the team plan"
    finally:
        cache.close()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "unreachable" in text and ":***@127.0.0.1" in text, text
    assert secret not in text, text
