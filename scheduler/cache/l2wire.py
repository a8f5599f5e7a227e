"""One L2 flush on the wire: every buffered write packed once into RESP bytes and sent as one pipeline.

redis-py's ``Pipeline`` spends ~40-50 us of Python per command (a command object, argument encoding through its
``Encoder``, per-command response callbacks); a flush of N entries paid that N times, which capped pipelined
writes near 3x one round trip each. Here the N ``SET name value PX ttl`` commands are packed with one bytes
format each (the RESP framing is fixed: key, value and TTL are the only variable parts), sent with one
``send_packed_command`` on a pooled connection, and the N replies are read back. The semantics are those of
the pipeline it replaces: plain commands, no MULTI/EXEC, so each SET lands on its own (a failing one does not
undo the others) and other clients' commands may interleave between them.
"""

from __future__ import annotations

from typing import Any

_SET = b"*5\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$2\r\nPX\r\n$%d\r\n%b\r\n"


def pack_sets(batch: list[tuple[str, bytes, int]]) -> bytes:
    """RESP of ``SET name blob PX ttl_ms`` for each write, in order (names are ASCII: namespace, version, hex)."""
    parts = []
    for name, blob, ttl_ms in batch:
        key = name.encode()
        ttl = b"%d" % ttl_ms
        parts.append(_SET % (len(key), key, len(blob), blob, len(ttl), ttl))
    return b"".join(parts)


def send_sets(pool: Any, batch: list[tuple[str, bytes, int]]) -> int:
    """Send ``batch`` as one packed pipeline; returns how many SETs the server refused (e.g. OOM).

    Connection errors propagate (the caller marks the tier down); the connection is then dropped, not reused,
    since its reply stream is out of step."""
    from redis.exceptions import ResponseError

    data = pack_sets(batch)
    conn = pool.get_connection()  # redis-py >= 5.3: no command name
    refused = 0
    try:
        conn.send_packed_command([data], check_health=False)  # a list of chunks
        for _ in batch:
            try:
                conn.read_response()
            except ResponseError:  # one SET refused: the server carries on with the next ones
                refused += 1
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    return refused
