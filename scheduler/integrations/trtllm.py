"""Put the cache-aware capacity policy into TensorRT-LLM's PyTorch-backend executor.

TensorRT-LLM's ``PyExecutor`` asks ``scheduler.capacity_scheduler.schedule_request(active_requests)`` each
iteration for ``(fitting, fitting_disagg_gen_init, paused)`` (``tensorrt_llm/_torch/pyexecutor/scheduler.py``:
``CapacityScheduler``; the default is ``BindCapacityScheduler`` over the C++ GUARANTEED_NO_EVICT loop, built in
``_util.create_py_executor_instance`` and wrapped in a ``SimpleScheduler`` with the micro-batch scheduler).
``CacheAwareCapacityScheduler`` is a drop-in ``CapacityScheduler``:

- requests already running (generating, or with part of their context computed) keep their reservation and are
  always scheduled -- nothing admitted is ever paused or evicted;
- new context requests are admitted while their blocks to completion
  (``kv_cache_manager.get_needed_resource_to_completion``) fit in what the running ones leave of
  ``get_max_resource_count()``, skipping ahead of one that does not fit by at most ``skip_window`` entries, with
  aging (``policies.Policy.select``, the same code the simulator runs);
- a request that needs more blocks than the whole cache is never scheduled; it is reported once through
  ``on_reject(request, RejectReason)`` (``install`` wires that to the executor's error path when it has one),
  instead of waiting forever as GUARANTEED_NO_EVICT does up to TensorRT-LLM 1.2.

Prefix reuse is not credited here (TensorRT-LLM's count to completion does not subtract reused blocks); its block
manager still shares them physically. Everything TensorRT-LLM is imported lazily; without it ``install`` raises
``BackendError``. This glue follows the released source (v1.2 / main) and was NOT run against a real
TensorRT-LLM installation in this project's CI; the decision logic (``decide``) is tested on plain data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtforge.build_engine.core.errors import BackendError

from ..policies import Policy, get_policy
from ..scheduler import RejectReason

_FIX = ("install TensorRT-LLM (pip install tensorrt_llm from NVIDIA's index, or use an NGC TensorRT-LLM "
        "container) to use the TensorRT-LLM adapter; the simulator needs nothing")


def _trtllm() -> tuple[Any, Any, Any]:
    """(scheduler module, _util module, LlmRequestState) or BackendError."""
    try:
        import importlib

        sched = importlib.import_module("tensorrt_llm._torch.pyexecutor.scheduler")
        util = importlib.import_module("tensorrt_llm._torch.pyexecutor._util")
        llm_request = importlib.import_module("tensorrt_llm._torch.pyexecutor.llm_request")
    except ImportError as exc:
        raise BackendError(f"TensorRT-LLM is not importable ({exc}); {_FIX}") from exc
    return sched, util, llm_request.LlmRequestState


@dataclass
class Candidate:
    """What the decision needs of one active request (plain data)."""

    id: int
    running: bool
    needed_blocks: int
    skips: int = 0


@dataclass
class Decision:
    scheduled: list[int] = field(default_factory=list)
    never_fit: list[int] = field(default_factory=list)


def decide(candidates: Sequence[Candidate], max_blocks: int, max_requests: int, policy: Policy) -> Decision:
    """Running candidates first (their reservation stands), then new ones per ``policy.select``."""
    out = Decision()
    reserved = 0
    pending: list[Candidate] = []
    for c in candidates:
        if c.running:
            out.scheduled.append(c.id)
            reserved += c.needed_blocks
        elif c.needed_blocks > max_blocks:
            out.never_fit.append(c.id)
        else:
            pending.append(c)
    free = [max_blocks - reserved]

    def try_admit(c: Candidate) -> bool:
        if c.needed_blocks <= free[0]:
            free[0] -= c.needed_blocks
            out.scheduled.append(c.id)
            return True
        return False

    policy.select(pending, try_admit, lambda: len(out.scheduled) < max_requests)
    return out


class CacheAwareCapacityScheduler:
    """``schedule_request(active_requests) -> (fitting, fitting_disagg_gen_init, paused)`` (paused is empty)."""

    def __init__(self, kv_cache_manager: Any, max_num_requests: int, skip_window: int | None = None,
                 max_skips: int | None = None,
                 on_reject: Callable[[Any, RejectReason], None] | None = None) -> None:
        _, _, self._state = _trtllm()
        self.kv = kv_cache_manager
        self.max_num_requests = max_num_requests
        self.policy = get_policy("cache-aware", skip_window, max_skips)
        self.on_reject = on_reject
        self._skips: dict[int, int] = {}
        self._rejected: set[int] = set()

    def _is_running(self, req: Any) -> bool:
        s = self._state
        if req.state in (s.GENERATION_IN_PROGRESS, getattr(s, "GENERATION_TO_COMPLETE", None)):
            return True
        return req.state == s.CONTEXT_INIT and getattr(req, "context_current_position", 0) > 0

    def schedule_request(self, active_requests: Sequence[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        s = self._state
        max_blocks = int(self.kv.get_max_resource_count())
        by_id: dict[int, Any] = {}
        cands: list[Candidate] = []
        for req in active_requests:
            st = req.state
            if st not in (s.CONTEXT_INIT, s.GENERATION_IN_PROGRESS, getattr(s, "GENERATION_TO_COMPLETE", None),
                          getattr(s, "DISAGG_GENERATION_INIT", None)):
                continue
            rid = int(req.request_id)
            if rid in self._rejected:
                continue
            by_id[rid] = req
            cands.append(Candidate(rid, self._is_running(req), int(self.kv.get_needed_resource_to_completion(req)),
                                   self._skips.get(rid, 0)))
        d = decide(cands, max_blocks, self.max_num_requests, self.policy)
        for c in cands:
            if c.skips:
                self._skips[c.id] = c.skips
        for rid in d.scheduled:
            self._skips.pop(rid, None)
        for rid in d.never_fit:
            self._rejected.add(rid)
            need = next(c.needed_blocks for c in cands if c.id == rid)
            reason = RejectReason("kv-never-fits", need, max_blocks, 0,
                                  f"request {rid} needs {need} KV blocks but the cache holds {max_blocks}; "
                                  "lower max_tokens or the prompt, or give the KV cache more memory")
            if self.on_reject is not None:
                self.on_reject(by_id[rid], reason)
        fitting: list[Any] = []
        disagg: list[Any] = []
        for rid in d.scheduled:
            req = by_id[rid]
            (disagg if req.state == getattr(s, "DISAGG_GENERATION_INIT", object()) else fitting).append(req)
        return fitting, disagg, []


def install(py_executor: Any, skip_window: int | None = None, max_skips: int | None = None) -> Any:
    """Replace a built ``PyExecutor``'s capacity scheduler with ``CacheAwareCapacityScheduler``; returns it."""
    _trtllm()
    sched = getattr(py_executor, "scheduler", None)
    if sched is None or not hasattr(sched, "capacity_scheduler"):
        raise BackendError("this TensorRT-LLM executor has no scheduler.capacity_scheduler to replace; the adapter "
                           "supports the PyTorch backend's SimpleScheduler (TensorRT-LLM 1.x)")
    kv = py_executor.resource_manager.resource_managers.get("kv_cache_manager")
    if kv is None:
        raise BackendError("the executor has no kv_cache_manager; the cache-aware scheduler needs a KV cache")
    max_requests = getattr(sched.capacity_scheduler, "max_num_requests", None) or getattr(
        py_executor, "max_batch_size", None) or 256
    handler = getattr(py_executor, "_handle_errors", None)

    def on_reject(req: Any, reason: RejectReason) -> None:
        if handler is not None:
            handler(reason.message, requests=[req])

    cap = CacheAwareCapacityScheduler(kv, int(max_requests), skip_window, max_skips, on_reject)
    sched.capacity_scheduler = cap
    return cap


def patch_executor_creation(**kwargs: Any) -> Callable[[], None]:
    """Wrap ``_util.create_py_executor_instance`` (and the creator module's imported name) so every executor it
    builds gets the cache-aware capacity scheduler. Returns a function that restores the originals."""
    import importlib

    _, util, _ = _trtllm()
    original = util.create_py_executor_instance
    modules = [util]
    try:
        creator = importlib.import_module("tensorrt_llm._torch.pyexecutor.py_executor_creator")
        if getattr(creator, "create_py_executor_instance", None) is original:
            modules.append(creator)
    except ImportError:
        pass

    def create_py_executor_instance(*args: Any, **kw: Any) -> Any:
        executor = original(*args, **kw)
        install(executor, **kwargs)
        return executor

    for m in modules:
        m.create_py_executor_instance = create_py_executor_instance

    def restore() -> None:
        for m in modules:
            m.create_py_executor_instance = original

    return restore
