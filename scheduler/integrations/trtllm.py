"""Put the project's ``Scheduler`` into TensorRT-LLM's PyTorch-backend executor as its capacity scheduler.

What is measured is what is deployed: ``CacheAwareCapacityScheduler`` drives the SAME ``Scheduler`` object the
simulator drives. Each ``schedule_request(active_requests)`` call (the upstream contract, see
``trtllm_contract``) does what the simulator's replay does around ``Scheduler.step``:

- requests that left ``active_requests`` ended upstream (end-of-sequence, cap, cancel): ``finish`` / ``cancel``
  free their blocks and LoRA slot;
- a request now past its context phase had its prompt computed: ``context_done`` makes its prompt blocks
  findable, as ``update`` does after a simulated prefill (so prefix reuse is credited exactly as simulated);
- new requests are ``submit``-ted in arrival order; one that can never run is rejected once, with its
  ``RejectReason`` message, through the executor's error path that does not spend its error budget;
- the capacity stage ``Scheduler.admit`` runs against the live free blocks (blocks the KV cache manager holds
  beyond this scheduler's reservations are kept out of admission);
- ``fitting`` is every request the scheduler holds as running, in arrival order; ``paused`` is always empty
  (nothing admitted is evicted: only reserve-to-completion policies are accepted here);
- ``install`` deploys only policies that reject a never-fit request (``cache-aware``, ``trtllm-main-no-evict``):
  under ``trtllm-1.2-no-evict`` one such request would block the executor's queue forever. The class itself takes
  that policy too, so tests can compare it with the simulator's replay of TensorRT-LLM 1.2.

``tensorrt_llm`` is imported lazily (``install``); the class itself needs only TensorRT-LLM's request states,
which tests pass as a stand-in enum with the same member names. NOT run against a real TensorRT-LLM in this
project's CI: tests drive it with small fakes of ``LlmRequest``, ``LlmRequestState`` and the KV cache manager
and check that its decisions equal the simulator's on the same request stream.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

from trtforge.build_engine.core.errors import BackendError, InputError

from ..policies import get_policy
from ..request import Request, hashes_from_tokens
from ..scheduler import Scheduler, SchedulerConfig
from . import trtllm_contract as contract

log = logging.getLogger("trtforge.scheduler.trtllm")

_FIX = ("install TensorRT-LLM (pip install tensorrt_llm from NVIDIA's index, or use an NGC TensorRT-LLM "
        "container) to use the TensorRT-LLM adapter; the simulator needs nothing")


def _trtllm() -> tuple[Any, Any, Any]:
    """(_util module, LlmRequestState, ResourceManagerType or None) or BackendError."""
    try:
        import importlib

        util = importlib.import_module("tensorrt_llm._torch.pyexecutor._util")
        llm_request = importlib.import_module("tensorrt_llm._torch.pyexecutor.llm_request")
        rm = importlib.import_module("tensorrt_llm._torch.pyexecutor.resource_manager")
    except ImportError as exc:
        raise BackendError(f"TensorRT-LLM is not importable ({exc}); {_FIX}") from exc
    return util, llm_request.LlmRequestState, getattr(rm, "ResourceManagerType", None)


class CacheAwareCapacityScheduler:
    """``schedule_request(active_requests) -> (fitting, fitting_disagg_gen_init, paused)`` over a ``Scheduler``."""

    def __init__(self, scheduler: Scheduler, kv_cache_manager: Any, states: Any,
                 reject: Callable[[Any, str], bool] | None = None) -> None:
        if scheduler.policy.preempts:
            raise InputError(f"policy {scheduler.policy.name!r} preempts; the TensorRT-LLM adapter runs "
                             "reserve-to-completion policies only (cache-aware, trtllm-main-no-evict, "
                             "trtllm-1.2-no-evict)")
        self.sched = scheduler
        self.kv = kv_cache_manager
        self.s = states
        self.reject = reject
        self._live: dict[str, Any] = {}  # submitted, not ended, in arrival order: id -> its LlmRequest
        self._rejected: set[str] = set()
        self._schedulable = {x for x in (getattr(states, n, None) for n in (
            "CONTEXT_INIT", "GENERATION_IN_PROGRESS", "GENERATION_TO_COMPLETE", "DISAGG_GENERATION_INIT"))
            if x is not None}
        self._past_context = {x for x in (getattr(states, n, None) for n in (
            "GENERATION_IN_PROGRESS", "GENERATION_TO_COMPLETE")) if x is not None}

    @staticmethod
    def request_id(req: Any) -> str:
        rid = getattr(req, "py_request_id", None)
        return str(req.request_id if rid is None else rid)

    def to_request(self, req: Any) -> Request:
        """The scheduler's view of an ``LlmRequest``: prompt, cap, adapter, and block hashes of its tokens."""
        prompt = int(req.prompt_len)
        tpb = self.sched.config.tokens_per_block
        tokens = list(req.get_tokens(0))[:prompt]
        task = getattr(req, "lora_task_id", None)
        return Request(self.request_id(req), 0.0, prompt, int(req.max_new_tokens),
                       block_hashes=hashes_from_tokens(tokens, tpb), hash_block_tokens=tpb,
                       adapter=None if task is None else f"lora-{task}")

    def schedule_request(self, active_requests: Sequence[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        present: dict[str, Any] = {}
        for req in active_requests:
            if req.state in self._schedulable:
                present[self.request_id(req)] = req
        self._contexts_done(present)
        self._end_missing(present)
        self._bound_by_live_blocks()  # before submit, which may admit at once
        for rid, req in present.items():
            if rid not in self._live and rid not in self._rejected:
                self._submit(rid, req)
        self.sched.admit()
        fitting: list[Any] = []
        disagg: list[Any] = []
        gen_init = getattr(self.s, "DISAGG_GENERATION_INIT", object())
        for rid, req in present.items():
            if rid in self._live and self.sched.state(rid) == "running":
                (disagg if req.state == gen_init else fitting).append(req)
        return fitting, disagg, []

    def can_schedule(self, requests: Sequence[Any]) -> bool:
        """Whether the capacity stage would hold every one of ``requests`` as running (upstream
        ``SimpleScheduler.can_schedule``: ``len(fitting) == len(requests)``), answered on a copy of the scheduler so
        the query changes nothing. Through ``schedule_request`` it ended every live request missing from
        ``requests``: their blocks were freed here while the executor still used them, and they were forgotten."""
        sched = copy.deepcopy(self.sched, {id(self.sched.metrics): None, id(self.sched.clock): self.sched.clock})
        for req in requests:
            rid = self.request_id(req)
            if rid in self._rejected:
                return False
            if rid in sched.seqs:
                continue
            try:
                r = self.to_request(req)
            except InputError:
                return False
            if r.adapter is not None:
                sched.lora.register(r.adapter)
            if sched.submit(r).status == "rejected":
                return False
        sched.admit()
        return all(sched.state(self.request_id(req)) == "running" for req in requests)

    @staticmethod
    def _generated(req: Any) -> int:
        """Tokens ``req`` has produced (``get_tokens(0)`` is the prompt, then the output)."""
        return len(req.get_tokens(0)) - int(req.prompt_len)

    def _contexts_done(self, present: dict[str, Any]) -> None:
        """Make the prompt blocks of every request whose context ran findable, in admission order, before any
        request ends: what ``Scheduler.update`` does after a simulated step. That includes a request that ended
        in its first iteration (end-of-sequence or a cap of one token at its first token): it left
        ``active_requests`` without ever being seen past its context, yet its prompt was computed (and
        TensorRT-LLM keeps those blocks for reuse)."""
        ran = []
        for rid, req in self._live.items():
            now = present.get(rid)
            if now is not None:
                self._live[rid] = now  # the executor's current object (the same one, upstream)
            if now.state in self._past_context if now is not None else self._generated(req) > 0:
                ran.append(self.sched.seqs[rid])
        for seq in sorted(ran, key=lambda q: q.order):
            self.sched.context_done(seq.req.id)

    def _end_missing(self, present: dict[str, Any]) -> None:
        """End what left ``active_requests`` and forget it: a server runs for days, so an ended request's state
        (its ``Seq``, ``Request`` and block hashes; a rejected id) must not stay in memory. Only the simulator
        reads ended requests (its heaps, its metrics); this adapter never asks about them again.

        The order they free their blocks in is the prefix cache's LRU order, so it is the simulator's: requests
        that reached their cap first, in admission order (``Scheduler.update`` ends those), then the others
        (end-of-sequence, cancel) in admission order too (``simulator._end_of_sequence``)."""
        gone = [rid for rid in self._live if rid not in present]
        seqs = self.sched.seqs

        def capped(rid: str) -> tuple[int, int]:
            seq, req = seqs[rid], self._live[rid]
            if seq.state == "running" and self._generated(req) >= seq.req.max_new_tokens:
                return 0 if seq.req.max_new_tokens == 1 else 1, seq.order  # update ends cap-1 requests first
            return 2, seq.order if seq.state == "running" else 0  # a queued one frees no block

        for rid in sorted(gone, key=capped):
            del self._live[rid]
            state = self.sched.state(rid)
            if state == "running":
                self.sched.finish(rid)
            elif state == "queued":
                self.sched.cancel(rid)
            seqs.pop(rid, None)
        self._rejected.intersection_update(present)

    def _submit(self, rid: str, req: Any) -> None:
        try:
            r = self.to_request(req)
        except InputError as exc:  # an empty prompt or max_tokens 0: refuse that request, never fail the executor
            message: str | None = f"{exc.message}; the scheduler runs prompts of >= 1 token with max_tokens >= 1"
        else:
            if r.adapter is not None:
                self.sched.lora.register(r.adapter)  # the executor's PEFT cache validated the task id already
            res = self.sched.submit(r)
            message = None if res.status != "rejected" else (
                res.reason.message if res.reason else f"request {rid} rejected")
        if message is not None:
            self._rejected.add(rid)  # until it leaves active_requests: rejected once, not every iteration
            self.sched.seqs.pop(rid, None)
            if self.reject is not None:
                self.reject(req, message)
            return
        self._live[rid] = req

    def _bound_by_live_blocks(self) -> None:
        """Blocks the KV cache manager holds beyond this scheduler's reservations (requests it does not see,
        a smaller pool than announced) are kept out of admission; reserved-but-unwritten blocks are ours."""
        free = contract.live_free_blocks(self.kv)
        if free is None:
            return
        upstream_used = self.sched.config.num_blocks - free
        self.sched.outside_blocks = max(0, upstream_used - self.sched.used_blocks)


def _check_deployable(policy: str) -> None:
    """InputError for a policy that would hang a deployed executor on a request that can never fit."""
    if not get_policy(policy).reject_never_fit:
        raise InputError(f"policy {policy!r} never rejects a request that can never fit: deployed, one such request "
                         "would sit at the head of the executor's queue forever and block every later one (as in "
                         "TensorRT-LLM 1.2); deploy cache-aware or trtllm-main-no-evict, which reject it with a reason")


def install(py_executor: Any, policy: str = "cache-aware", skip_window: int | None = None,
            max_skips: int | None = None, max_num_requests: int | None = None,
            lora_slots: int | None = None) -> CacheAwareCapacityScheduler:
    """Replace a built ``PyExecutor``'s capacity stage with ``CacheAwareCapacityScheduler``; returns it."""
    _, states, rm_type = _trtllm()
    return install_with(py_executor, states, rm_type, policy=policy, skip_window=skip_window,
                        max_skips=max_skips, max_num_requests=max_num_requests, lora_slots=lora_slots)


def install_with(py_executor: Any, states: Any, rm_type: Any, *, policy: str = "cache-aware",
                 skip_window: int | None = None, max_skips: int | None = None,
                 max_num_requests: int | None = None, lora_slots: int | None = None) -> CacheAwareCapacityScheduler:
    """``install`` with TensorRT-LLM's ``LlmRequestState`` and ``ResourceManagerType`` given (tests pass
    stand-ins with the same member names)."""
    _check_deployable(policy)
    request_scheduler = getattr(py_executor, "scheduler", None)
    if request_scheduler is None:
        raise BackendError("this TensorRT-LLM executor has no scheduler to extend; the adapter supports the "
                           "PyTorch backend's PyExecutor")
    kv = contract.kv_cache_manager(py_executor.resource_manager, rm_type)
    host = contract.capacity_host(request_scheduler)
    old = getattr(host, "capacity_scheduler", None)
    max_req = max_num_requests or contract.max_num_requests(py_executor, old)
    max_seq_len = getattr(py_executor, "max_seq_len", None)
    if not max_seq_len:
        log.warning("the executor gives no max_seq_len: prompts up to 131072 tokens are admitted; set the engine's "
                    "max_seq_len so that longer ones are rejected as prompt-too-long")
    cfg = SchedulerConfig(num_blocks=int(kv.get_max_resource_count()), tokens_per_block=int(kv.tokens_per_block),
                          policy=policy, max_seq_len=int(max_seq_len or 131072),
                          token_budget=max(8192, max_req), max_running=max_req,
                          lora_slots=max_req if lora_slots is None else lora_slots,
                          skip_window=skip_window, max_skips=max_skips)
    cap = CacheAwareCapacityScheduler(Scheduler(cfg), kv, states, contract.rejecter(py_executor))
    if host is not None:
        host.capacity_scheduler = cap
        if callable(getattr(host, "can_schedule", None)):  # upstream's runs the capacity stage on a subset
            host.can_schedule = cap.can_schedule
    else:  # KV-cache-V2 path / multimodal wrapper on main: no capacity stage to swap, so filter in front of it
        py_executor.scheduler = contract.CapacityFirst(request_scheduler, cap)
    return cap


def patch_executor_creation(**kwargs: Any) -> Callable[[], None]:
    """Wrap ``_util.create_py_executor_instance`` (and the creator module's imported name) so every executor it
    builds gets the cache-aware capacity scheduler. Returns a function that restores the originals."""
    import importlib

    _check_deployable(kwargs.get("policy", "cache-aware"))  # now, not when the first executor is built
    util, _, _ = _trtllm()
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
