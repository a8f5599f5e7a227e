"""Executors: run cell jobs on local worker processes or as Ray tasks; retry crashes, never deterministic failures.

- ``local``: ``jobs`` long-lived ``spawn`` worker processes (trtforge and TensorRT imported once per worker). Each
  result comes back over the worker's pipe; a pipe that closes without a result means the worker died (killed, out
  of memory): it is replaced by a new process and the cell retried, up to ``retries`` times.
- ``ray``: one task per cell, requesting one CPU and the cell's custom resource. Ray itself retries a task whose
  worker died (``max_retries``) on any node with the resource; ``retry_exceptions=False`` because deterministic
  failures come back as results. A cell whose resource no node advertises is refused before submission (Ray would
  leave it pending forever). The source model travels through the object store once per model (``ray.put``) and
  the engine's files come back as the task's return value, unless the matrix asks for a shared filesystem.
"""

from __future__ import annotations

import collections
import contextlib
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core import env, interrupt
from ..core.errors import InputError
from .worker import KILL_ONCE_ENV, CellJob, CellResult, run_cell

Event = Callable[[int, str, int, "CellResult | None"], None]  # (cell index, state, attempt, result when done)


@dataclass(frozen=True)
class Submission:
    index: int
    job: CellJob
    resource: str
    source_key: str  # cells of one model share one copy of its bytes


def _serve(conn: Any) -> None:
    """A local worker: build the cells it is sent until it gets None (or the driver goes away)."""
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        conn.send(run_cell(job))


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode} without a result"


class _Workers:
    """``jobs`` long-lived ``spawn`` processes (imports paid once per worker, not per cell); a dead one is replaced."""

    def __init__(self, jobs: int) -> None:
        import multiprocessing as mp

        self.ctx = mp.get_context("spawn")
        self.idle = [self._spawn() for _ in range(jobs)]
        self.busy: dict[Any, tuple[Any, Submission, int]] = {}  # conn -> (process, submission, attempt)

    def _spawn(self) -> tuple[Any, Any]:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_serve, args=(child,), daemon=True)
        proc.start()
        child.close()  # the worker holds the only other end: EOF here means it is gone
        return proc, parent

    def submit(self, sub: Submission, attempt: int) -> None:
        proc, conn = self.idle.pop()
        conn.send(sub.job)
        self.busy[conn] = (proc, sub, attempt)

    def collect(self) -> list[tuple[Submission, int, CellResult | None, str]]:
        """Wait for at least one busy worker; (submission, attempt, result or None if it died, death reason)."""
        from multiprocessing.connection import wait

        out: list[tuple[Submission, int, CellResult | None, str]] = []
        conn: Any  # a multiprocessing Connection (wait() is typed for sockets and fds too)
        for conn in wait(list(self.busy)):
            proc, sub, attempt = self.busy.pop(conn)
            try:
                out.append((sub, attempt, conn.recv(), ""))
                self.idle.append((proc, conn))
            except (EOFError, OSError):
                conn.close()
                proc.join()
                out.append((sub, attempt, None, _death(proc.exitcode)))
                self.idle.append(self._spawn())
        return out

    def close(self) -> None:
        for _proc, conn in self.idle:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc, _, _ in self.busy.values():
            proc.kill()
        for proc, _ in self.idle:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        for proc, _, _ in self.busy.values():
            proc.join()


def run_local(subs: Sequence[Submission], jobs: int, retries: int, on_event: Event) -> dict[int, CellResult]:
    """Run every submission on local worker processes (see module docstring)."""
    pending: collections.deque[tuple[Submission, int]] = collections.deque((s, 0) for s in subs)
    results: dict[int, CellResult] = {}
    workers = _Workers(min(jobs, max(1, len(subs))))
    try:
        while pending or workers.busy:
            while pending and workers.idle:
                sub, done = pending.popleft()
                workers.submit(sub, done + 1)
                on_event(sub.index, "running", done + 1, None)
            for sub, attempt, result, death in workers.collect():
                if result is not None:
                    result.attempts = attempt
                elif attempt <= retries:
                    on_event(sub.index, "retry", attempt, None)
                    pending.append((sub, attempt))
                    continue
                else:
                    result = CellResult(ok=False, attempts=attempt, reason=(
                        f"the worker died in each of {attempt} attempts (last: {death}); check the machine's "
                        "memory and the build's log, or raise --retries"))
                results[sub.index] = result
                on_event(sub.index, "done", attempt, result)
    finally:
        workers.close()
    return results


def _ray_cell(job: CellJob, files: dict[str, bytes] | None) -> CellResult:
    result = run_cell(job if files is None else replace(job, source_files=files))
    result.attempts = _ray_attempt()
    return result


def _ray_attempt() -> int:
    """This task's attempt (1 + Ray's retries of it so far): a cell whose worker was killed and retried by Ray was
    reported built in 1 attempt. Ray's core worker is asked; 1 where this Ray has no such call."""
    import ray

    try:
        core: Any = getattr(ray._private.worker.global_worker, "core_worker")  # noqa: B009 (untyped in Ray)
        return 1 + int(core.get_current_task_attempt_number())
    except (AttributeError, TypeError, ValueError):
        return 1


def check_address(address: str, timeout_s: float = 3.0) -> None:
    """Refuse (InputError) a Ray ``--address`` (``host:port`` or ``ray://host:port``) where nothing accepts a TCP
    connection, or where what answers is not a gRPC server (a web server, sshd): ``ray.init`` waited there for
    minutes (its GCS connection retries) before failing. "local" and "auto", and addresses of another form, are left
    to Ray."""
    import socket

    target = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = target.rpartition(":")
    if address in ("local", "auto") or not sep or not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            speaks_grpc = _answers_http2(sock, timeout_s)
    except OSError as exc:
        raise InputError(f"--address {address}: no Ray head answers there ({exc.strerror or type(exc).__name__}); "
                         "start one (ray start --head --port=PORT) or fix --address, or use --address local") \
            from exc
    if not speaks_grpc:  # another service (a web server, sshd) on that port: ray.init waited there for minutes too
        raise InputError(f"--address {address}: something listens there but it is not a Ray head (no gRPC answer); "
                         "give the head's GCS port (ray start --head --port, default 6379) or ray://HOST:10001")


def _answers_http2(sock: Any, timeout_s: float) -> bool:
    """Whether the server answers an HTTP/2 client preface with a SETTINGS frame, as a gRPC server (Ray's GCS, the
    Ray Client server) does at once."""
    import socket

    sock.settimeout(timeout_s)
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # + empty SETTINGS
    head = b""
    with contextlib.suppress(socket.timeout, OSError):
        while len(head) < 9:  # a frame header: length (3), type (1: 0x04 is SETTINGS), flags, stream id
            chunk = sock.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    return len(head) == 9 and head[3] == 0x04


def start_ray(address: str, jobs: int) -> bool:
    """Connect to ``address`` or start a local cluster ("local"); returns True when this call started one."""
    import ray

    from .cells import node_resources

    if ray.is_initialized():  # the caller (a benchmark, a notebook) already connected this process
        return False
    kill_once = env.get(env.TEST_KILL_ONCE_DIR)
    env_vars = {KILL_ONCE_ENV: kill_once} if kill_once else {}
    if env.get_flag(env.LORA_ALIAS):  # part of LoRA cells' keys: the workers build what the driver keyed
        env_vars[env.LORA_ALIAS.name] = "1"
    runtime_env = {"env_vars": env_vars} if env_vars else None
    from .ray_watch import reconnect_timeout

    # Read by Ray's core worker as ray.init creates it: the head watch (ray_watch), not Ray, ends a lost run.
    with _sigterm_kept(), env.override(env.RAY_RECONNECT, reconnect_timeout()):
        if address == "local":
            ray.init(num_cpus=jobs, resources=node_resources(), include_dashboard=False, log_to_driver=False,
                     configure_logging=False, runtime_env=runtime_env)
            return True
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False, runtime_env=runtime_env)
        except ConnectionError as exc:  # e.g. a head with token authentication and no token here: was exit 3
            text = " ".join(str(exc).split())[:200]
            raise InputError(f"--address {address}: cannot join the Ray cluster ({text}); check the address and, for "
                             "a cluster with token authentication, its token (RAY_AUTH_TOKEN)") from exc
    return False


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """``ray.init`` replaces the SIGTERM handler (``sys.exit(15)``, and Ray's C++ handler printed a stack dump):
    a SIGTERM then exited 1, not 143. The handler in place before (the CLI's, core.interrupt) is put back."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _ray_wait(refs: list[Any], watch: Any) -> list[Any]:
    """``ray.wait`` for one result, watching the head (``ray_watch``). Ray turns the exception a signal handler
    raises (core.interrupt's Interrupted, which carries SIGTERM's 143) into a plain KeyboardInterrupt; the signal is
    raised again as it came."""
    from .ray_watch import wait_one

    try:
        return wait_one(refs, watch)
    except KeyboardInterrupt as exc:
        signum = interrupt.pending()
        if isinstance(exc, interrupt.Interrupted) or signum is None:
            raise
        raise interrupt.Interrupted(signum) from None


def _placeable_resources() -> set[str]:
    """The resources some live node advertises (at least one unit) beside at least one CPU: where a cell's task
    (1 CPU and one unit of its resource, on one node) can run. The cluster's totals could not tell: a head started
    with ``--num-cpus=0`` and trtforge's resources, beside CPU nodes without them, left every task pending forever."""
    import ray

    out: set[str] = set()
    for node in ray.nodes():
        res = node.get("Resources") or {}
        if node.get("Alive") and res.get("CPU", 0) >= 1:
            out.update(k for k, v in res.items() if v >= 1)
    return out


def run_ray(subs: Sequence[Submission], sources: dict[str, dict[str, bytes] | None], retries: int,
            on_event: Event) -> dict[int, CellResult]:
    """Run every submission as a Ray task on the connected cluster (see module docstring)."""
    import ray

    from .ray_watch import HeadWatch

    watch = HeadWatch.of_connected()
    placeable = _placeable_resources()
    remote = ray.remote(_ray_cell)
    refs: dict[str, Any] = {key: (ray.put(files) if files is not None else None) for key, files in sources.items()}
    waiting: dict[Any, Submission] = {}
    results: dict[int, CellResult] = {}
    for sub in subs:
        if sub.resource not in placeable:
            results[sub.index] = CellResult(ok=False, refused=True, attempts=0, reason=(
                f"no node in the Ray cluster advertises resource {sub.resource!r} beside a CPU (a cell's task needs "
                "both on one node; a head started with --num-cpus=0 runs none); start a node that can build it "
                f"with: ray start --address=... --resources='{{\"{sub.resource}\": 1}}' "
                "(see 'trtforge build-matrix --node-resources')"))
            on_event(sub.index, "done", 0, results[sub.index])
            continue
        options = {"num_cpus": 1, "resources": {sub.resource: 1}, "max_retries": retries, "retry_exceptions": False}
        waiting[remote.options(**options).remote(sub.job, refs[sub.source_key])] = sub
        on_event(sub.index, "running", 1, None)
    while waiting:
        for ref in _ray_wait(list(waiting), watch):
            sub = waiting.pop(ref)
            try:
                results[sub.index] = ray.get(ref)
            except ray.exceptions.RayError as exc:  # the worker (or its node) died, and Ray's retries with it
                first = " ".join(str(exc).split())[:200]
                lost = isinstance(exc, (ray.exceptions.LocalRayletDiedError, ray.exceptions.NodeDiedError))
                # A lost node ends every task on it at once: "died in each of N attempts" was not what happened.
                what = "its Ray node died" if lost else f"the Ray worker died in each of {retries + 1} attempts"
                results[sub.index] = CellResult(ok=False, attempts=1 if lost else retries + 1, reason=(
                    f"{what} ({type(exc).__name__}: {first}); check the node's memory and logs"
                    + ("" if lost else ", or raise --retries")))
            on_event(sub.index, "done", results[sub.index].attempts, results[sub.index])
    return results


def run_on_ray(subs: Sequence[Submission], sources: dict[str, dict[str, bytes] | None], address: str, jobs: int,
               retries: int, on_event: Event) -> str | None:
    """``start_ray`` then ``run_ray``. A cluster lost during the run (its head stopped answering: ``ray_watch``; Ray
    failing to answer) or one Ray cannot start is no crash of the driver: the reason comes back, for every cell not
    finished, and the finished ones have had their events. None when the run ended normally. Bad input (an
    ``--address`` that cannot be joined) stays an InputError; the driver's own errors (its disk) propagate."""
    import ray

    from .ray_watch import ClusterLost

    def why(exc: BaseException, when: str) -> str:
        text = " ".join(str(exc).split())[:200]
        return (f"not finished: Ray {when} ({type(exc).__name__}: {text}); check the cluster (ray status) and run "
                "build-matrix again (finished cells are cached)")

    try:
        started = start_ray(address, jobs)
    except (ray.exceptions.RayError, ConnectionError, RuntimeError, OSError) as exc:  # e.g. a socket path too long
        return why(exc, "could not start")
    try:
        run_ray(subs, sources, retries, on_event)
        return None
    except ClusterLost as exc:
        return str(exc)
    except (ray.exceptions.RayError, ConnectionError) as exc:
        return why(exc, "failed during the run")
    finally:
        if started:
            with contextlib.suppress(Exception):
                ray.shutdown()
