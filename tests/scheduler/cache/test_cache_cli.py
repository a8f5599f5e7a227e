"""``trtforge cache``: bad input exits 2 naming the file or URL; invalidate reaches a second replica."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trtforge.build_engine.cli import main
from trtforge.scheduler.cache.entry import CacheConfig
from trtforge.scheduler.cache.front import ResponseCache
from trtforge_testing import CliResult, assert_one_line_error


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> CliResult:
    code = main(["cache", *argv])
    out, err = capsys.readouterr()
    return CliResult(code, out, err)


def test_key_prints_the_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "r.json"
    req.write_text(json.dumps({"model": "m", "messages": [{"role": "user", "content": " hi  there "}],
                               "temperature": 0}))
    res = _run(capsys, "key", str(req))
    assert res.code == 0
    got = json.loads(res.out)
    assert got["cacheable"] and got["final_user_message"] == "hi there" and len(got["key"]) == 64


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not valid JSON"),
    (json.dumps({"model": 3, "messages": []}), "'model'"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "warm"}),
     "'temperature'"),
])
def test_key_bad_request_exits_2_naming_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                             needle: str) -> None:
    req = tmp_path / "bad.json"
    req.write_text(content)
    assert_one_line_error(_run(capsys, "key", str(req)), 2, "bad.json", needle)


def test_unreachable_redis_exits_2_naming_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(_run(capsys, "ping", "--redis-url", "redis://127.0.0.1:1/0"), 2, "redis://127.0.0.1:1/0")
    assert_one_line_error(_run(capsys, "ping", "--redis-url", "http://x"), 2, "--redis-url")


def test_invalidate_after_deploy_reaches_replicas(redis_server, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "ping", "--redis-url", redis_server.url).code == 0
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace="t:cli")
    replica = ResponseCache(cfg, engine_sha="old")
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "manifest.json").write_text('{"format": 1}\n')
    res = _run(capsys, "invalidate", str(engine), "--redis-url", redis_server.url, "--namespace", "t:cli")
    assert res.code == 0, res.err
    deadline = time.monotonic() + 5
    while replica.engine_sha == "old" and time.monotonic() < deadline:
        time.sleep(0.02)
    import hashlib

    assert replica.engine_sha == hashlib.sha256(b'{"format": 1}\n').hexdigest()
    replica.close()
    missing = _run(capsys, "invalidate", str(tmp_path / "nope"), "--redis-url", redis_server.url)
    assert_one_line_error(missing, 2, "manifest.json")


def test_redis_that_refuses_exits_2_with_one_line_naming_the_reason(own_redis, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """At maxmemory (noeviction) ``invalidate`` printed the library's warning and a second, reasonless error line;
    ``simulate --response-cache l1,l2`` failed 'expected a l2, got miss'; a password-protected Redis was 'cannot
    reach Redis ... start redis-server'."""
    import redis

    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "manifest.json").write_text('{"format": 1}\n')
    admin = redis.Redis.from_url(own_redis.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    try:
        res = _run(capsys, "invalidate", str(engine), "--redis-url", own_redis.url)
        assert_one_line_error(res, 2, own_redis.url, "OutOfMemoryError", "maxmemory")
        sim = main(["simulate", "--trace", "synthetic:20", "--profile", "h100", "--model", "llama-3.1-8b",
                    "--policy", "vllm-v1", "--response-cache", "l1,l2", "--redis-url", own_redis.url])
        out, err = capsys.readouterr()
        assert_one_line_error(CliResult(sim, out, err), 2, own_redis.url, "maxmemory")
    finally:
        admin.config_set("maxmemory", "0")
    admin.config_set("requirepass", "s3cret")
    for argv in (["ping"], ["invalidate", str(engine)]):
        res = _run(capsys, *argv, "--redis-url", own_redis.url)
        assert_one_line_error(res, 2, own_redis.url, "password", "redis://:PASSWORD@")
    assert _run(capsys, "ping", "--redis-url", own_redis.url.replace("//", "//:s3cret@")).code == 0


def test_key_from_a_terminal_says_what_it_waits_for() -> None:
    """``cache key -`` with a terminal on stdin tells the user it waits for the JSON (it sat silent before), then
    reads what is typed up to Ctrl-D; with a pipe on stdin it stays quiet (tested by the contract suite)."""
    import os
    import subprocess
    import sys

    master, slave = os.openpty()
    try:
        exe = Path(sys.executable).with_name("trtforge")  # the console script, as ``run_console`` runs it
        proc = subprocess.Popen([str(exe), "cache", "key", "-"], stdin=slave,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.close(slave)
        req = json.dumps({"model": "m", "messages": [{"role": "user", "content": "terminal"}], "temperature": 0})
        os.write(master, req.encode() + b"\n\x04")
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
    assert proc.returncode == 0, err
    assert "Ctrl-D" in err and "terminal" in err
    assert json.loads(out)["final_user_message"] == "terminal"
