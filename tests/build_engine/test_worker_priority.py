"""A build's worker threads run at a lower CPU priority; the calling thread and the process keep theirs."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from trtforge.build_engine.engine import worker_priority

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux-only")


def _own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_workers_are_reniced_and_the_main_thread_is_not() -> None:
    main_before = _own_nice()
    process_before = os.getpriority(os.PRIO_PROCESS, 0)
    with ThreadPoolExecutor(max_workers=2, initializer=worker_priority.lower_priority) as pool:
        seen = {pool.submit(_own_nice).result() for _ in range(4)}
    assert seen == {min(19, main_before + worker_priority.WORKER_NICE)}
    assert _own_nice() == main_before
    assert os.getpriority(os.PRIO_PROCESS, 0) == process_before


def test_zero_leaves_the_thread_alone() -> None:
    before = _own_nice()
    with ThreadPoolExecutor(max_workers=1, initializer=worker_priority.lower_priority, initargs=(0,)) as pool:
        assert pool.submit(_own_nice).result() == before
