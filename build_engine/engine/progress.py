"""Build progress: a ``trt.IProgressMonitor`` subclass that draws rich progress bars on stderr.

The class must derive from the backend module's own ``IProgressMonitor`` (tensorrt and tensorrt_rtx each have one),
so it is created per module inside ``make_progress_monitor``; nothing here imports TensorRT at module import.
TensorRT calls the monitor from its build thread; rich's Progress is thread-safe. ``step_complete`` returns False,
which cancels the build, once SIGINT or SIGTERM arrived (``core.interrupt.pending``, readable from any thread); the
builder then raises ``Interrupted``. Without ``show`` the monitor draws nothing and is only there to cancel.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


def make_progress_monitor(trt: ModuleType, show: bool = True) -> Any:
    """An ``IProgressMonitor`` for ``trt`` with ``start()`` / ``stop()`` around the build; bars only with ``show``."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..core import interrupt
    from ..core.staging import fault_point

    class RichProgressMonitor(trt.IProgressMonitor):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=True, disable=not show,
            )
            self._tasks: dict[str, Any] = {}
            self._depth: dict[str, int] = {}

        def start(self) -> None:
            self._progress.start()

        def stop(self) -> None:
            self._progress.stop()

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            depth = self._depth.get(parent_phase, -1) + 1 if parent_phase else 0
            self._depth[phase_name] = depth
            self._tasks[phase_name] = self._progress.add_task("  " * depth + phase_name, total=max(num_steps, 1))

        def step_complete(self, phase_name: str, step: int) -> bool:
            fault_point("build:step")  # test hook (core.staging): a signal in the middle of TensorRT's build
            task = self._tasks.get(phase_name)
            if task is not None:
                self._progress.update(task, completed=step + 1)
            return interrupt.pending() is None

        def phase_finish(self, phase_name: str) -> None:
            task = self._tasks.pop(phase_name, None)
            if task is not None:
                self._progress.remove_task(task)

    return RichProgressMonitor()
