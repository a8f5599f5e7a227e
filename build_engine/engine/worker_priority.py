"""Background threads of a build run at a lower CPU priority than TensorRT's own threads.

During ``build``, worker threads hash the source's weights (1 GiB for the 2 GiB example) and copy them into
``model.onnx.data`` while TensorRT builds. At equal priority on a 2-core machine they slowed TensorRT's build from
about 3.6 s to about 6 s, more than their own run time (bench/RESULTS.md, issue 18 build share, 2026-12-02). At a
higher nice value the kernel gives TensorRT's threads the cores first and the workers the cycles it leaves; the
build then waits for the workers only if they are not done when TensorRT is. Only the worker threads are reniced
(Linux treats a thread id as a process id for ``setpriority``), never the process or its main thread.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

#: Niceness added to a build's worker threads. Not 19: on a machine busy with other processes the workers must
#: still progress (at nice 10 a thread weighs about a tenth of a nice-0 one in Linux's scheduler).
WORKER_NICE = 10

_log = logging.getLogger("trtforge.build_engine.engine.worker_priority")


def lower_priority(nice: int | None = None) -> None:
    """Raise the calling thread's niceness by ``nice`` (``WORKER_NICE``); a ThreadPoolExecutor ``initializer``.

    Linux only: elsewhere a thread id is not a valid ``setpriority`` target (it could name another process).
    A refusal (a sandbox without the permission) leaves the thread as it is."""
    if not sys.platform.startswith("linux"):
        return
    step = WORKER_NICE if nice is None else nice
    if step <= 0:
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + step))
    except OSError as exc:
        _log.debug("worker thread keeps its priority: %s", exc)
