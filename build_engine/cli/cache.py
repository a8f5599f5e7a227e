"""``trtforge cache key|ping|invalidate``: the response cache's operator commands.

- ``key REQUEST.json`` (or ``-`` for stdin): the cache key of a request and what it was computed from (the key
  contract in scheduler/cache/keys.py), to check why two requests do or do not share an entry.
- ``ping --redis-url URL``: exit 0 when the L2 Redis answers, else exit 2 naming the URL.
- ``invalidate ENGINE_DIR --redis-url URL``: after deploying the engine in ENGINE_DIR, publish its manifest's sha256
  as the cache version, so every replica stops serving answers of the previous engine.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.errors import InputError
from ..core.jsonout import unique_keys
from ._common import ArgumentParser, add_debug, make_parser, run_command


def build_parser() -> ArgumentParser:
    p = make_parser("trtforge cache", "Response-cache tools: a request's key, Redis reachability, invalidation.")
    sub = p.add_subparsers(dest="sub", metavar="{key,ping,invalidate}", parser_class=ArgumentParser)
    sub.required = True
    key = sub.add_parser("key", help="print a request's cache key and whether it is cacheable")
    add_debug(key)
    key.add_argument("request", help="request JSON file (chat-completions style), or - for stdin")
    key.add_argument("--cache-sampled", action="store_true", help="policy: cache sampled requests too")
    for name, helptext in (("ping", "check that the L2 Redis answers"),
                           ("invalidate", "publish a new engine's manifest sha256 as the cache version")):
        sp = sub.add_parser(name, help=helptext)
        add_debug(sp)
        if name == "invalidate":
            sp.add_argument("engine", type=Path, help="engine folder (manifest.json) now deployed")
        sp.add_argument("--redis-url", required=True, help="redis://host:port/db")
        sp.add_argument("--namespace", default="trtforge:rc",
                        help="key prefix shared by the replicas (default trtforge:rc)" if name == "invalidate" else
                        "accepted so ping takes invalidate's options; ping only checks that the server answers")
    return p


def _read_request(where: str) -> Any:
    if where != "-":  # a FIFO would block the read forever; '-' is how a stream is given
        from ..core import paths

        paths.check(inputs=[("REQUEST.json", where)])
    if where == "-" and sys.stdin.isatty():  # a silent wait on a terminal looks like a hang
        print("reading the request JSON from the terminal: paste it, then press Ctrl-D", file=sys.stderr, flush=True)
    try:
        text = sys.stdin.read() if where == "-" else Path(where).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: cannot read the request ({exc}); give a UTF-8 JSON file") from exc
    try:
        # a leading BOM (Windows editors) is not JSON's error; a key given twice is (which one would the server read?)
        return json.loads(text.removeprefix("\ufeff"), object_pairs_hook=unique_keys)
    except ValueError as exc:
        raise InputError(f"{where}: not valid JSON ({exc}); give one JSON object") from exc
    except RecursionError as exc:
        raise InputError(f"{where}: not readable JSON (nested too deeply); give one JSON object of plain fields") \
            from exc


def _client(given: str) -> Any:
    import redis

    from trtforge.scheduler.cache.entry import check_redis_db, redact_url

    check_redis_db(given)
    url = redact_url(given)  # as the messages name it: never its password
    try:
        client = redis.Redis.from_url(given, socket_timeout=1.0, socket_connect_timeout=1.0)
        client.ping()
        return client
    except ValueError as exc:
        raise InputError(f"--redis-url {url}: not a Redis URL ({exc}); use redis://host:port/db") from exc
    except redis.AuthenticationError as exc:  # it answers, and wants a password (or another one)
        raise InputError(f"Redis at {url} refused the login (a wrong or missing password); give it in --redis-url "
                         "(redis://:PASSWORD@host:port/db)") from exc
    except redis.ResponseError as exc:  # it answers, and refused the connection's set-up (e.g. a db out of range)
        raise InputError(f"Redis at {url} refused the connection ({str(exc)[:120]}); fix --redis-url") from exc
    except (redis.RedisError, OSError) as exc:
        raise InputError(f"cannot reach Redis at {url} ({type(exc).__name__}); start redis-server or fix "
                         "--redis-url") from exc


def _run(args: Any) -> int:
    if args.sub == "key":
        from trtforge.scheduler.cache.keys import make_key

        req = _read_request(args.request)
        try:
            key = make_key(req, cache_sampled=args.cache_sampled)
        except InputError as exc:
            raise InputError(f"{args.request}: {exc.message}") from exc
        print(json.dumps({"key": key.digest, "cacheable": key.cacheable, "scope": json.loads(key.scope),
                          "final_user_message": key.text}, indent=2, ensure_ascii=False))
        return 0
    from trtforge.scheduler.cache.entry import redact_url

    client = _client(args.redis_url)
    url = redact_url(args.redis_url)
    if args.sub == "ping":
        print(f"{url}: ok")
        return 0
    from trtforge.scheduler.cache.pubsub import Invalidation

    manifest = args.engine / "manifest.json"
    try:
        sha = hashlib.sha256(manifest.read_bytes()).hexdigest()
    except OSError as exc:
        raise InputError(f"{manifest}: cannot read it ({exc.strerror}); give an engine folder from trtforge build") \
            from exc
    import redis

    inv = Invalidation(client, args.namespace, lambda *_: None)
    try:
        stored = inv.stored()
        index = stored[1] if stored is not None else 1
        try:  # send, not publish: one error line naming the reason, no library warning (nor a retry) beside it
            inv.send(sha, index)
        except (redis.RedisError, OSError) as exc:
            reason = str(exc).rpartition("caused error: ")[2][:120]  # a pipeline's error names the whole command
            raise InputError(f"cannot publish the cache version to Redis at {url} ({type(exc).__name__}: "
                             f"{reason}); fix the server (e.g. memory at maxmemory) and retry") from exc
    finally:
        inv.close()
    print(f"published cache version {sha[:16]}.{index} for {args.engine} on {url}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
