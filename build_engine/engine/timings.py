"""Where the time of one ``build_engine`` call goes, for ``bench/build.py`` (and the build's own timers).

The steps add up to the call's wall time; worker-thread tasks are recorded apart because they overlap the steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")


@dataclass
class BuildTimings:
    """Seconds spent per step of one ``build_engine`` call; the steps add up to its wall time ("other" is whatever
    fell between the timed steps: starting and joining the worker threads, publishing OUTDIR, freeing objects).

    Three groups: TensorRT's own work (``TENSORRT``: creating the builder/network/parser and parsing; building);
    trtforge's disk I/O (``IO``: reading the source file; writing model.plan while hashing it, and waiting for the
    worker that writes model.onnx during the build; writing manifest.json); trtforge's compute (everything else:
    protobuf and numpy work, checks, configuring, freeing).
    """

    TENSORRT = ("parse", "build")
    IO = ("read_source", "write_plan", "manifest")

    steps: dict[str, float] = field(default_factory=dict)
    # Seconds each worker-thread task ran (hashing the source, writing model.onnx, creating the plan file). They
    # overlap the steps above, so they are not part of the wall time; a step that waits for one counts the wait.
    background: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.steps[name] = self.steps.get(name, 0.0) + seconds

    def submit(self, pool: ThreadPoolExecutor, name: str, fn: Callable[..., _T], *args: Any) -> Future[_T]:
        """``pool.submit(fn, *args)``, recording how long the task ran under ``background[name]``."""

        def timed() -> _T:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.add_background(name, time.perf_counter() - t0)

        return pool.submit(timed)

    def add_background(self, name: str, seconds: float) -> None:
        self.background[name] = self.background.get(name, 0.0) + seconds

    @property
    def tensorrt(self) -> float:
        return sum(self.steps.get(k, 0.0) for k in self.TENSORRT)

    @property
    def own_io(self) -> float:
        return sum(self.steps.get(k, 0.0) for k in self.IO)

    @property
    def own_compute(self) -> float:
        return self.total - self.tensorrt - self.own_io

    @property
    def total(self) -> float:
        return sum(self.steps.values())


class _Timer:
    def __init__(self, timings: BuildTimings, name: str) -> None:
        self.timings, self.name = timings, name

    def __enter__(self) -> None:
        from ..core import steps

        # TensorRT's build has its own progress bars (one live display at a time); every other step gets a spinner.
        self._step = None if self.name == "build" else steps.step(self.name)
        if self._step is not None:
            self._step.__enter__()
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timings.add(self.name, time.perf_counter() - self.start)
        if self._step is not None:
            self._step.__exit__(None, None, None)
