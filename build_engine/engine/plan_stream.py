"""The plan written while TensorRT serialises it (``build_serialized_network_to_stream``), instead of after.

``build_serialized_network`` returns the whole plan in one host buffer (``IHostMemory``) beside the builder's own
copy of the weights, and only then can it be hashed and written: for a model with 1 GiB of weights that is 1 GiB
more peak memory and a 1 GiB write nothing overlaps. With a stream writer TensorRT hands the plan over in chunks
(64 MiB with TensorRT-RTX 1.7) as it serialises; each chunk is copied once, into one of ``_BUFFERS`` reused
buffers (fresh memory costs page faults that make a copy several times slower here), and handed to two worker
threads, one writing the file and one hashing (both release the GIL), so the write and the hash run alongside the
rest of the serialisation and at most ``_BUFFERS`` chunks are held. ``PlanStream.callback_seconds`` is the time spent
inside TensorRT's calls to ``write`` (trtforge's share of the build step); ``finish`` waits for the workers.

The file is written with ``O_DIRECT`` where the file system allows it (``core/direct_write.py``): a buffered write
of fresh pages cost ~1 CPU-second per GiB here, on the cores TensorRT and the hash need. The buffers are page
aligned; each chunk is placed after the unaligned rest of the previous one, only the aligned prefix is written, and
the last rest is written by ``finish``. The hash worker sees each chunk's own bytes once, in order.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

from ..core.direct_write import ALIGN, DirectFile, aligned_buffer
from ..core.errors import BuildError
from .timings import BuildTimings

_BUFFERS = 3  # chunk buffers in use at once: bounds the extra memory to a few chunks
_SPLIT_COPY = 8 << 20  # chunks from this size are copied by two threads
_STOP: Any = object()  # tells a worker that the plan is complete


def supported(builder: Any) -> bool:
    return hasattr(builder, "build_serialized_network_to_stream")


class PlanStream:
    """Receives the plan from TensorRT; writes it to ``path`` and hashes it on worker threads."""

    def __init__(self, trt: ModuleType, path: Path) -> None:
        self.path = path
        self.size = 0
        self.callback_seconds = 0.0
        self.error: BaseException | None = None
        self._sha = hashlib.sha256()
        self._file = DirectFile(path)
        self._carry = b""  # the unaligned end of the last chunk: written in front of the next one
        self._closed = False
        self._copier: ThreadPoolExecutor | None = None  # the second half of big chunk copies
        self._queues: list[queue.Queue[Any]] = [queue.Queue(), queue.Queue()]
        self._free: queue.Queue[memoryview | None] = queue.Queue()
        for _ in range(_BUFFERS):
            self._free.put(None)  # allocated on first use, at the size of the chunk
        self._lock = threading.Lock()
        self._pending: dict[int, int] = {}  # id(buffer) -> workers still reading it
        self._threads = [threading.Thread(target=self._run, args=(q, f), name=f"trtforge-plan-{n}", daemon=True)
                         for q, f, n in ((self._queues[0], self._file.write, "write"),
                                         (self._queues[1], self._sha.update, "hash"))]
        for t in self._threads:
            t.start()
        self.writer = _make_writer(trt, self)

    def _run(self, q: queue.Queue[Any], fn: Any) -> None:
        while True:
            item = q.get()
            if item is _STOP:
                return
            buf, view = item
            if self.error is None and view.nbytes:
                try:
                    fn(view)
                except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
                    self.error = exc
            del view
            with self._lock:
                self._pending[id(buf)] -= 1
                done = self._pending[id(buf)] == 0
            if done:
                self._free.put(buf)  # both workers are done with it: reusable

    def accept(self, data: Any) -> int:
        """TensorRT's ``write``: queue a copy of the chunk (its buffer is only valid during the call)."""
        t0 = time.perf_counter()
        if self.error is not None:
            return 0  # TensorRT then fails the build; finish() raises the cause
        src = memoryview(data).cast("B")
        n = src.nbytes
        c = len(self._carry)
        buf = self._free.get()  # waits while every buffer is still being written or hashed
        if buf is None or buf.nbytes < c + n:
            buf = aligned_buffer(n + ALIGN)  # room for any carry (< ALIGN), so the next chunks reuse it
        buf[:c] = self._carry
        self._copy(buf[c:c + n], src)
        end = c + n
        cut = end - end % ALIGN if self._file.direct else end
        self._carry = bytes(buf[cut:end])
        with self._lock:
            self._pending[id(buf)] = len(self._queues)
        self._queues[0].put((buf, buf[:cut]))  # the file: the aligned prefix, the previous rest in front
        self._queues[1].put((buf, buf[c:end]))  # the hash: this chunk's bytes
        self.size += n
        self.callback_seconds += time.perf_counter() - t0
        return n

    def _copy(self, dst: memoryview, src: memoryview) -> None:
        """``dst[:] = src``; a big chunk in two halves, one on the copy thread (numpy's copy releases the GIL). The
        copy is the only work inside TensorRT's call, while the hash of the previous chunk is usually done and its
        core idle: two halves took 7 ms instead of 12 ms per 64 MiB here."""
        n = src.nbytes
        if n < _SPLIT_COPY:
            dst[:] = src
            return
        import numpy as np

        d, s = np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8)
        half = n // 2
        if self._copier is None:
            self._copier = ThreadPoolExecutor(1, thread_name_prefix="trtforge-plan-copy")
        other = self._copier.submit(np.copyto, d[half:], s[half:])
        np.copyto(d[:half], s[:half])
        other.result()

    def finish(self) -> str:
        """Wait for the workers and close the file; the plan's sha256 (raises what a worker raised)."""
        self.close()
        if self.error is not None:
            raise self.error
        return self._sha.hexdigest()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for q in self._queues:
            q.put(_STOP)
        for t in self._threads:
            t.join()
        if self._copier is not None:
            self._copier.shutdown()
        try:
            self._file.close(self._carry if self.error is None else b"")
        except OSError as exc:
            self.error = self.error or exc


def _make_writer(trt: ModuleType, stream: PlanStream) -> Any:
    class Writer(trt.IStreamWriter):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            trt.IStreamWriter.__init__(self)

        def write(self, data: Any) -> int:
            return stream.accept(data)

    return Writer()


def run_build(trt: ModuleType, builder: Any, network: Any, config: Any, plan_path: Path) -> Any:
    """The plan streamed to ``plan_path`` during serialisation (``plan_stream``) where the backend can; else the
    ``IHostMemory``. None when TensorRT fails."""
    if not supported(builder):
        return builder.build_serialized_network(network, config)
    stream = PlanStream(trt, plan_path)
    try:
        ok = builder.build_serialized_network_to_stream(network, config, stream.writer)
    except BaseException:
        stream.close()
        raise
    if not ok:
        stream.close()
        if stream.error is not None:
            raise BuildError(f"cannot write {plan_path}: {stream.error}") from stream.error
        return None
    return stream


def write_plan(serialized: Any, path: Path, io_pool: ThreadPoolExecutor, writes: list[Future[Any]],
               timings: BuildTimings) -> str:
    """Write the plan on a worker while this thread hashes it; returns the sha256. ``IHostMemory`` exposes the buffer
    protocol, so neither side copies the plan. A plan streamed during the build is only waited for; the time spent
    in its callbacks moves from TensorRT's build step to this one."""
    if isinstance(serialized, PlanStream):
        timings.add("build", -serialized.callback_seconds)
        timings.add("write_plan", serialized.callback_seconds)
        return serialized.finish()
    plan = memoryview(serialized)
    writes.append(timings.submit(io_pool, "write_plan", _write_all, path, plan))
    return hashlib.sha256(plan).hexdigest()


def _write_all(path: Path, data: memoryview) -> None:
    """Write ``data`` (the plan, through the buffer protocol: no copy) to a new file."""
    with open(path, "wb") as fh:
        fh.write(data)
