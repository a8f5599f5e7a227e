"""The TensorRT-LLM names the adapter relies on, in one place, each found by feature (never by version string).

Upstream (``NVIDIA/TensorRT-LLM``, PyTorch backend, read for release 1.2 and for ``main`` of late 2026):

- ``tensorrt_llm/_torch/pyexecutor/scheduler.py``: ``CapacityScheduler.schedule_request(active_requests) ->
  (fitting_requests, fitting_disagg_gen_init_requests, paused_requests)``; ``SimpleScheduler`` holds it as
  ``.capacity_scheduler`` beside ``.micro_batch_scheduler`` and its own ``schedule_request(active_requests,
  inflight_request_ids)`` calls the capacity stage first. ``BindCapacityScheduler.__init__(max_num_requests, ...)``
  hands ``max_num_requests`` to C++ and does not keep it (``PyCapacityScheduler`` does keep it).
  On ``main`` the KV-cache-V2 path and the multimodal wrapper are request schedulers without a
  ``capacity_scheduler`` attribute: there the adapter wraps the whole request scheduler (``CapacityFirst``).
- ``tensorrt_llm/_torch/pyexecutor/resource_manager.py``: ``ResourceManager.resource_managers`` is keyed by
  ``ResourceManagerType.KV_CACHE_MANAGER`` on ``main`` and by the string ``"kv_cache_manager"`` before;
  ``KVCacheManager.get_max_resource_count()`` (static), ``get_num_free_blocks()`` (live), ``tokens_per_block``,
  ``get_needed_resource_to_completion(request)``.
- ``tensorrt_llm/_torch/pyexecutor/py_executor.py``: ``PyExecutor.scheduler``, ``.resource_manager``,
  ``.max_num_active_requests`` (``max_batch_size * pp_size`` with pipeline parallelism), and
  ``_handle_errors(error_msg, *, requests=None, charge_budget=True)`` on ``main``: with ``charge_budget=False``
  a request-scoped failure does not spend the process-wide error budget (about ten charged errors shut the
  executor down). Release 1.2's ``_handle_errors(error_msg)`` has no ``requests`` and fails EVERY active
  request, so it is never called for one rejection there.
- ``tensorrt_llm/_torch/pyexecutor/llm_request.py``: ``LlmRequestState`` members ``CONTEXT_INIT``,
  ``GENERATION_IN_PROGRESS``, ``GENERATION_TO_COMPLETE``, ``DISAGG_GENERATION_INIT``; ``LlmRequest.request_id``,
  ``py_request_id``, ``prompt_len``, ``max_new_tokens``, ``lora_task_id``, ``get_tokens(beam)``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from trtforge.build_engine.core.errors import BackendError

log = logging.getLogger("trtforge.scheduler.trtllm")

# wrappers seen around a SimpleScheduler (the multimodal wrapper keeps the wrapped one under one of these)
_WRAPPED = ("scheduler", "inner", "_scheduler", "base_scheduler", "wrapped")


def kv_cache_manager(resource_manager: Any, rm_type: Any = None) -> Any:
    """The KV cache manager: keyed by ``ResourceManagerType.KV_CACHE_MANAGER`` (main) or the string (1.2)."""
    managers = getattr(resource_manager, "resource_managers", None)
    if managers is None:
        raise BackendError("the executor's resource_manager has no resource_managers dict; the adapter supports "
                           "the PyTorch backend's ResourceManager")
    keys: list[Any] = [getattr(rm_type, "KV_CACHE_MANAGER", None), "kv_cache_manager"]
    for key in keys:
        if key is not None and managers.get(key) is not None:
            return managers[key]
    for key, value in managers.items():  # an enum member not importable here: match by its name or value
        name = str(getattr(key, "name", key)).upper()
        if value is not None and "KV_CACHE_MANAGER" in (name, getattr(key, "value", None)):
            return value
    raise BackendError("the executor has no KV cache manager (neither ResourceManagerType.KV_CACHE_MANAGER nor "
                       "'kv_cache_manager' in resource_managers); the cache-aware scheduler needs a KV cache")


def capacity_host(request_scheduler: Any) -> Any | None:
    """The object holding ``capacity_scheduler`` (the scheduler itself or one wrapped level down), or None."""
    if hasattr(request_scheduler, "capacity_scheduler"):
        return request_scheduler
    for name in _WRAPPED:
        inner = getattr(request_scheduler, name, None)
        if inner is not None and inner is not request_scheduler and hasattr(inner, "capacity_scheduler"):
            return inner
    return None


def max_num_requests(py_executor: Any, capacity: Any | None) -> int:
    """Requests in flight: the capacity scheduler's own count, else the executor's, else batch size x pp."""
    for value in (getattr(capacity, "max_num_requests", None),
                  getattr(py_executor, "max_num_active_requests", None)):
        if isinstance(value, int) and value > 0:
            return value
    batch = getattr(py_executor, "max_batch_size", None)
    if not isinstance(batch, int) or batch < 1:
        raise BackendError("cannot tell how many requests the executor runs at once (no max_num_requests, "
                           "max_num_active_requests or max_batch_size); pass max_num_requests to install()")
    dist = getattr(py_executor, "dist", None)
    pp = getattr(dist, "pp_size", None) or getattr(getattr(py_executor, "mapping", None), "pp_size", None) or 1
    return batch * int(pp)  # with pipeline parallelism pp_size micro-batches are in flight at once


def live_free_blocks(kv: Any) -> int | None:
    getter = getattr(kv, "get_num_free_blocks", None)
    return int(getter()) if callable(getter) else None


def rejecter(py_executor: Any) -> Callable[[Any, str], bool]:
    """``reject(request, message) -> bool``: fail one request without spending the executor's error budget.

    ``charge_budget`` in the signature (main): ``_handle_errors(msg, requests=[r], charge_budget=False)``;
    ``requests`` without it: no budget exists, call with ``requests``; neither (1.2): do not call it (it would
    fail every active request), log, and return False -- the adapter then simply never schedules the request.
    """
    handler = getattr(py_executor, "_handle_errors", None)
    params: Sequence[str] = ()
    if callable(handler):
        try:
            params = tuple(inspect.signature(handler).parameters)
        except (TypeError, ValueError):
            params = ()

    def reject(request: Any, message: str) -> bool:
        if handler is None or "requests" not in params:
            log.warning("%s (this TensorRT-LLM cannot fail one request; it stays unscheduled)", message)
            return False
        if "charge_budget" in params:
            handler(message, requests=[request], charge_budget=False)
        else:
            handler(message, requests=[request])
        return True

    return reject


class CapacityFirst:
    """A request scheduler with no ``capacity_scheduler`` (KV-cache-V2 path, multimodal wrapper on main): our
    capacity stage filters ``active_requests`` first, then the wrapped scheduler schedules what fits."""

    def __init__(self, inner: Any, capacity: Any) -> None:
        self.inner = inner
        self.capacity_scheduler = capacity

    def schedule_request(self, active_requests: Any, inflight_request_ids: Any) -> Any:
        fitting, disagg, _ = self.capacity_scheduler.schedule_request(active_requests)
        return self.inner.schedule_request(list(fitting) + list(disagg), inflight_request_ids)

    def can_schedule(self, requests: Any) -> bool:
        # a query: schedule_request would end every live request missing from ``requests``
        return bool(self.capacity_scheduler.can_schedule(requests)) and bool(self.inner.can_schedule(requests))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
