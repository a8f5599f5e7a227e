"""One L2 flush on the wire: every buffered write packed once into RESP bytes and sent as one pipeline.

redis-py's ``Pipeline`` spends ~40-50 us of Python per command (a command object, argument encoding through its
``Encoder``, per-command response callbacks); a flush of N entries paid that N times, which capped pipelined
writes near 3x one round trip each. Here each write is packed into its ``SET name value PX ttl`` RESP command when
it is buffered (one bytes format: key, value and TTL are the only variable parts), a flush sends them with one
``send_packed_command`` on a pooled connection, and the N replies are read back in bulk. The semantics are those
of the pipeline it replaces: plain commands, no MULTI/EXEC and no script, so each SET lands on its own (a refused
one does not undo the others) and other clients' commands may interleave between them.

Reading the replies: a SET without NX/GET answers one line, ``+OK`` or ``-ERR...`` (an error line never holds a
CR or LF), so N replies are N CRLF-terminated lines. redis-py parses one reply per Python call (~2-3 us each, a
third of a pipelined write's cost); the lines are read from the connection's socket in a few ``recv`` calls and
counted instead. That needs a RESP2 connection (RESP3 may interleave push messages with the replies) and
redis-py's connection internals (``_sock``, the parser's ``SocketBuffer``), so it is used only on a RESP2
connection whose internals have the expected shape with nothing buffered; otherwise each reply goes through
``read_response`` as before. L2's pool speaks RESP2.
"""

from __future__ import annotations

from typing import Any

_SET = b"*5\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$2\r\nPX\r\n$%d\r\n%b\r\n"


def pack_set(name: bytes, blob: bytes, ttl_ms: int) -> bytes:
    """RESP of ``SET name blob PX ttl_ms``."""
    ttl = b"%d" % ttl_ms
    return _SET % (len(name), name, len(blob), blob, len(ttl), ttl)


def pack_sets(batch: list[tuple[str, bytes, int]]) -> bytes:
    """RESP of ``SET name blob PX ttl_ms`` for each write, in order (names are ASCII: namespace, version, hex)."""
    return b"".join(pack_set(name.encode(), blob, ttl_ms) for name, blob, ttl_ms in batch)


def send_sets(pool: Any, batch: list[tuple[str, bytes, int]]) -> int:
    """``send_packed`` of ``(name, blob, ttl_ms)`` writes."""
    return send_packed(pool, [pack_set(name.encode(), blob, ttl_ms) for name, blob, ttl_ms in batch])


def send_packed(pool: Any, commands: list[bytes]) -> int:
    """Send packed SET commands as one pipeline; returns how many the server refused (e.g. OOM).

    Connection errors propagate (the caller marks the tier down); the connection is then dropped, not reused,
    since its reply stream is out of step."""
    conn = pool.get_connection()  # redis-py >= 5.3: no command name
    try:
        conn.send_packed_command([b"".join(commands)], check_health=False)  # a list of chunks
        sock = getattr(conn, "_sock", None)
        unread = getattr(getattr(getattr(conn, "_parser", None), "_buffer", None), "unread_bytes", None)
        if sock is not None and getattr(conn, "protocol", None) == 2 and callable(unread) and unread() == 0:
            refused = _count_refused(sock, len(commands))
        else:
            refused = _read_each(conn, len(commands))
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    return refused


def _read_each(conn: Any, n: int) -> int:
    from redis.exceptions import ResponseError

    refused = 0
    for _ in range(n):
        try:
            conn.read_response()
        except ResponseError:  # one SET refused: the server carries on with the next ones
            refused += 1
    return refused


def _count_refused(sock: Any, n: int) -> int:
    """Read exactly ``n`` one-line replies from ``sock``; the number of error lines."""
    from redis.exceptions import ConnectionError, InvalidResponse

    data = bytearray()
    lines = 0
    while lines < n:
        start = max(0, len(data) - 1)  # a CRLF may straddle two reads
        chunk = sock.recv(65536)  # the connection's socket timeout applies; a timeout propagates (an outage)
        if not chunk:
            raise ConnectionError("Redis closed the connection while a flush's replies were read")
        data += chunk
        lines += data.count(b"\r\n", start)
    errors = data.count(b"\r\n-") + data.startswith(b"-")
    oks = data.count(b"\r\n+") + data.startswith(b"+")
    if lines != n or errors + oks != n or not data.endswith(b"\r\n"):
        raise InvalidResponse(f"unexpected reply to a flush of {n} SETs: {bytes(data[:80])!r}...")
    return errors
