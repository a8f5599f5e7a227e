"""TensorRT-LLM adapter: it drives the same ``Scheduler`` the simulator drives, so its decisions on a request
stream equal the simulator's; feature detection of 1.2 vs main; the clear error without TensorRT-LLM.

The fakes below are stand-ins ONLY for TensorRT-LLM's own classes, with their documented attribute names
(``LlmRequestState``, ``LlmRequest``, ``KVCacheManager``, ``ResourceManager``, ``ResourceManagerType``,
``SimpleScheduler``, ``BindCapacityScheduler``, ``PyExecutor``); the project's scheduler is real.
"""

from __future__ import annotations

import enum
import importlib.util
import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from trtforge.build_engine.core.errors import BackendError, InputError
from trtforge.scheduler.integrations.trtllm import CacheAwareCapacityScheduler, install_with, patch_executor_creation
from trtforge.scheduler.request import Request, hashes_from_tokens
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig

HAS_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None
TPB = 4


class LlmRequestState(enum.Enum):  # tensorrt_llm/_torch/pyexecutor/llm_request.py member names
    CONTEXT_INIT = 2
    DISAGG_GENERATION_INIT = 8
    GENERATION_IN_PROGRESS = 3
    GENERATION_TO_COMPLETE = 4
    GENERATION_COMPLETE = 5


class ResourceManagerType(enum.Enum):  # resource_manager.py on main
    KV_CACHE_MANAGER = "KV_CACHE_MANAGER"


@dataclass
class LlmRequest:
    request_id: int
    prompt_len: int
    max_new_tokens: int
    tokens: list[int]
    lora_task_id: int | None = None
    state: LlmRequestState = LlmRequestState.CONTEXT_INIT
    generated: int = 0
    stop_at: int = 0  # end-of-sequence (the executor's knowledge)

    def get_tokens(self, beam: int) -> list[int]:
        return self.tokens + [0] * self.generated  # the prompt, then the output so far (as upstream)


@dataclass
class KVCacheManager:
    num_blocks: int
    tokens_per_block: int = TPB
    requests: list[LlmRequest] = field(default_factory=list)
    held_elsewhere: int = 0

    def get_max_resource_count(self) -> int:
        return self.num_blocks

    def get_num_free_blocks(self) -> int:
        """Live: blocks written so far by running requests, full prompt blocks shared by content (reuse)."""
        shared: set[tuple[int, ...]] = set()
        private = 0
        for r in self.requests:
            if r.state not in (LlmRequestState.GENERATION_IN_PROGRESS, LlmRequestState.GENERATION_TO_COMPLETE):
                continue
            full = (r.prompt_len - 1) // TPB
            shared.update(tuple(r.tokens[:(i + 1) * TPB]) for i in range(full))
            private += math.ceil((r.prompt_len + r.generated) / TPB) - full
        return self.num_blocks - len(shared) - private - self.held_elsewhere


def _stream(seed: int, n: int = 60, caps_end: bool = False) -> list[tuple[int, LlmRequest]]:
    """(arrival iteration, request): shared prefixes, early EOS below the cap, one never-fit request.
    ``caps_end``: caps from 1 token and EOS up to 5 tokens past them, so many requests end at their cap, some at
    their first token (EOS or a 1-token cap) in the iteration that ran their context."""
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(12)]
    out = []
    for i in range(n):
        prompt = system[:rng.choice([0, 8, 12])] + [rng.randrange(1000) for _ in range(rng.randrange(1, 30))]
        cap = rng.randrange(1 if caps_end else 2, 24)
        if i == 7:
            prompt, cap = prompt + [1] * 200, 40  # needs more blocks than the cache holds
        task = rng.choice([None, None, 0, 1, 2])  # LoRA adapters: 3 of them over 2 slots, so some wait
        out.append((i // 3, LlmRequest(i, len(prompt), cap, prompt, lora_task_id=task,
                                       stop_at=rng.randrange(1, cap + 6 if caps_end else cap))))
    return out


def _config(policy: str) -> SchedulerConfig:
    return SchedulerConfig(num_blocks=48, tokens_per_block=TPB, policy=policy, token_budget=4096, max_running=6,
                           skip_window=3, max_skips=4, lora_slots=2, adapters=("lora-0", "lora-1", "lora-2"))


def _simulated(stream: list[tuple[int, LlmRequest]], policy: str, iters: int) -> list[list[str]]:
    """What the simulator does: submit arrivals, step(), finish requests at their end-of-sequence."""
    s = Scheduler(_config(policy))
    batches = []
    for k in range(iters):
        for at, r in stream:
            if at == k:
                s.submit(Request(str(r.request_id), 0.0, r.prompt_len, r.max_new_tokens,
                                 hashes_from_tokens(r.tokens, TPB), TPB,
                                 adapter=None if r.lora_task_id is None else f"lora-{r.lora_task_id}"))
        plan = s.step()
        batches.append(sorted({c[0] for c in plan.context} | set(plan.decode), key=int))
        # end-of-sequence (always before the cap here), in admission order as the simulator and the adapter free
        # them: the order blocks are freed in decides which cached prefixes the LRU keeps
        ended = [rid for rid in s.decoding if s.seqs[rid].generated(plan.step) >= stream[int(rid)][1].stop_at]
        for rid in sorted(ended, key=lambda rid: s.seqs[rid].order):
            s.finish(rid)
    return batches


def _deployed(stream: list[tuple[int, LlmRequest]], policy: str, iters: int) -> tuple[list[list[str]], list]:
    """A fake executor loop: schedule_request over the active requests, run one iteration of each fitting one."""
    kv = KVCacheManager(48)
    rejected: list[Any] = []
    cap = CacheAwareCapacityScheduler(Scheduler(_config(policy)), kv, LlmRequestState,
                                      lambda req, msg: rejected.append((req.request_id, msg)) or True)
    active: list[LlmRequest] = []
    batches = []
    for k in range(iters):
        active += [r for at, r in stream if at == k]
        kv.requests = active
        fitting, disagg, paused = cap.schedule_request(active)
        assert not disagg and not paused
        batches.append(sorted((str(r.request_id) for r in fitting), key=int))
        for r in fitting:
            r.generated += 1
            r.state = LlmRequestState.GENERATION_IN_PROGRESS
            if r.generated >= min(r.stop_at, r.max_new_tokens):
                r.state = LlmRequestState.GENERATION_COMPLETE
        active = [r for r in active if r.state != LlmRequestState.GENERATION_COMPLETE
                  and r.request_id not in {x[0] for x in rejected}]
    return batches, rejected


@pytest.mark.parametrize("policy", ["cache-aware", "trtllm-main-no-evict"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adapter_decisions_equal_the_simulators(policy: str, seed: int) -> None:
    sim = _simulated(_stream(seed), policy, 120)
    dep, rejected = _deployed(_stream(seed), policy, 120)
    assert dep == sim
    assert [r[0] for r in rejected] == [7] and "KV blocks" in rejected[0][1]
    assert sum(map(len, sim)) > 100 and not sim[-1]  # it did work, and all of it finished


@pytest.mark.parametrize("policy", ["cache-aware", "trtllm-main-no-evict", "trtllm-1.2-no-evict"])
@pytest.mark.parametrize("seed", [0, 2, 4, 6, 8])
def test_adapter_decisions_equal_the_simulators_when_caps_and_first_tokens_end_requests(policy: str,
                                                                                       seed: int) -> None:
    # held-out QA: a request that ended in the iteration that ran its context (EOS at its first token, or a
    # 1-token cap) left active_requests without being seen past its context, so the adapter never made its
    # prompt blocks findable while the simulator did (sim and deployment diverged on 20 of 180 such streams);
    # and requests reaching their cap in one step freed their blocks in a different order (the LRU order)
    sim = _simulated(_stream(seed, caps_end=True), policy, 150)
    dep, rejected = _deployed(_stream(seed, caps_end=True), policy, 150)
    assert dep == sim
    if policy != "trtllm-1.2-no-evict":  # 1.2 never rejects: request 7 blocks the queue there, in both
        assert [r[0] for r in rejected] == [7] and sum(map(len, sim)) > 100 and not sim[-1]


def test_prompt_of_a_request_ended_at_its_first_token_is_credited() -> None:
    kv = KVCacheManager(48)
    cap = CacheAwareCapacityScheduler(Scheduler(_config("cache-aware")), kv, LlmRequestState)
    shared = list(range(100, 116))  # 4 full blocks
    a = LlmRequest(1, 17, 1, shared + [1])  # max_tokens 1: done after the iteration that runs its context
    fitting, _, _ = cap.schedule_request([a])
    assert fitting == [a]
    a.generated, a.state = 1, LlmRequestState.GENERATION_COMPLETE
    b = LlmRequest(2, 17, 4, shared + [2])
    kv.requests = [b]
    fitting, _, _ = cap.schedule_request([b])  # a left active_requests; b arrives with a's prefix
    assert fitting == [b] and cap.sched.seqs["2"].hits == 4  # a's computed prompt blocks were kept for reuse


def test_empty_prompt_or_zero_max_tokens_is_rejected_not_raised() -> None:
    # the scheduler's Request refuses them (InputError): raised out of schedule_request, that failed the
    # executor's whole iteration (every active request) instead of the one request
    rejected: list[tuple[int, str]] = []
    cap = CacheAwareCapacityScheduler(Scheduler(_config("cache-aware")), KVCacheManager(48), LlmRequestState,
                                      lambda req, msg: rejected.append((req.request_id, msg)) or True)
    ok, empty, zero = LlmRequest(1, 6, 4, list(range(6))), LlmRequest(2, 0, 4, []), LlmRequest(3, 6, 0, [1] * 6)
    for _ in range(2):  # rejected once, not every iteration
        fitting, _, _ = cap.schedule_request([ok, empty, zero])
        assert fitting == [ok]
    assert [r[0] for r in rejected] == [2, 3]
    assert "prompt_tokens must be >= 1" in rejected[0][1] and "max_new_tokens must be >= 1" in rejected[1][1]


def test_adapter_keeps_blocks_held_elsewhere_out_of_admission() -> None:
    kv = KVCacheManager(20, held_elsewhere=12)  # live free blocks: 8, though the static maximum is 20
    cap = CacheAwareCapacityScheduler(Scheduler(_config("cache-aware").__class__(
        num_blocks=20, tokens_per_block=TPB, max_running=4, token_budget=64)), kv, LlmRequestState)
    a = LlmRequest(1, 20, 8, list(range(20)))  # 7 blocks: fits in 8
    b = LlmRequest(2, 20, 8, list(range(100, 120)))  # 7 more: fits the static maximum, not the live blocks
    kv.requests = [a, b]
    fitting, _, _ = cap.schedule_request([a, b])
    assert [r.request_id for r in fitting] == [1]
    kv.held_elsewhere = 0
    fitting, _, _ = cap.schedule_request([a, b])
    assert [r.request_id for r in fitting] == [1, 2]


class BindCapacityScheduler:  # does not keep max_num_requests (it goes to C++)
    pass


@dataclass
class SimpleScheduler:
    capacity_scheduler: Any
    micro_batch_scheduler: Any = None


class KvCacheV2Scheduler:  # main: a request scheduler with no capacity_scheduler attribute
    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def schedule_request(self, active_requests: list, inflight_request_ids: set) -> tuple:
        self.seen.append([r.request_id for r in active_requests])
        return active_requests, [], []


@dataclass
class ResourceManager:
    resource_managers: dict


class Dist:
    pp_size = 2


class PyExecutorMain:
    def __init__(self, scheduler: Any, kv: Any) -> None:
        self.scheduler = scheduler
        self.resource_manager = ResourceManager({ResourceManagerType.KV_CACHE_MANAGER: kv})
        self.max_batch_size = 3
        self.dist = Dist()
        self.errors: list[tuple] = []

    def _handle_errors(self, error_msg: str | None = None, *, requests: list | None = None,
                       charge_budget: bool = True) -> None:
        self.errors.append((error_msg, [r.request_id for r in requests or []], charge_budget))


class PyExecutor12:
    def __init__(self, scheduler: Any, kv: Any) -> None:
        self.scheduler = scheduler
        self.resource_manager = ResourceManager({"kv_cache_manager": kv})
        self.max_num_active_requests = 5
        self.failed_all = False

    def _handle_errors(self, error_msg: str | None = None) -> None:  # 1.2: fails every active request
        self.failed_all = True


def test_install_on_main_kv_v2_path_pp_and_budget_free_rejection() -> None:
    kv = KVCacheManager(10)
    inner = KvCacheV2Scheduler()
    ex = PyExecutorMain(inner, kv)
    cap = install_with(ex, LlmRequestState, ResourceManagerType)
    assert cap.sched.config.max_running == 6  # max_batch_size 3 x pp_size 2
    assert ex.scheduler.inner is inner  # wrapped: the V2 scheduler has no capacity_scheduler to swap
    big, small = LlmRequest(1, 60, 10, list(range(60))), LlmRequest(2, 4, 2, [1, 2, 3, 4])
    ex.scheduler.schedule_request([big, small], set())
    assert inner.seen == [[2]]
    assert len(ex.errors) == 1 and ex.errors[0][1:] == ([1], False)  # rejected without spending the budget
    assert "KV blocks" in ex.errors[0][0]


def test_install_on_release_1_2() -> None:
    kv = KVCacheManager(10)
    simple = SimpleScheduler(BindCapacityScheduler())
    ex = PyExecutor12(simple, kv)
    cap = install_with(ex, LlmRequestState, None)
    assert simple.capacity_scheduler is cap and cap.sched.config.max_running == 5
    fitting, _, _ = cap.schedule_request([LlmRequest(1, 60, 10, list(range(60))), LlmRequest(2, 4, 2, [1] * 4)])
    assert [r.request_id for r in fitting] == [2]
    assert not ex.failed_all  # 1.2's _handle_errors would fail every request: never called for one rejection
    with pytest.raises(BackendError, match="KV cache manager"):
        install_with(PyExecutor12(simple, None), LlmRequestState, None)


@pytest.mark.parametrize("policy", ["trtllm-1.2-no-evict", "fcfs-no-evict"])
def test_install_refuses_a_policy_that_never_rejects_a_never_fit_request(policy: str) -> None:
    # deployed, a request larger than the whole cache would sit at the head of the queue forever, blocking the rest
    ex = PyExecutor12(SimpleScheduler(BindCapacityScheduler()), KVCacheManager(10))
    with pytest.raises(InputError, match="never rejects a request that can never fit.*cache-aware"):
        install_with(ex, LlmRequestState, None, policy=policy)
    with pytest.raises(InputError, match="never rejects"):  # refused when patching, before TensorRT-LLM is needed
        patch_executor_creation(policy=policy)


@pytest.mark.skipif(HAS_TRTLLM, reason="TensorRT-LLM is installed")
def test_absent_trtllm_gives_clear_error() -> None:
    from trtforge.scheduler.integrations.trtllm import install, patch_executor_creation

    for call in (lambda: install(object()), patch_executor_creation):
        with pytest.raises(BackendError, match="TensorRT-LLM is not importable.*install TensorRT-LLM"):
            call()


def test_with_real_trtllm() -> None:
    pytest.importorskip("tensorrt_llm")
    from tensorrt_llm._torch.pyexecutor import _util

    from trtforge.scheduler.integrations.trtllm import patch_executor_creation

    original = _util.create_py_executor_instance
    restore = patch_executor_creation()
    assert _util.create_py_executor_instance is not original
    restore()
    assert _util.create_py_executor_instance is original


def test_adapter_forgets_ended_requests() -> None:
    # a deployed server sees millions of requests: the adapter's Scheduler held every ended one (Seq, Request,
    # block hashes) and every rejected id forever; now only live requests are kept, with the same decisions
    kv = KVCacheManager(48)
    cap = CacheAwareCapacityScheduler(Scheduler(_config("cache-aware")), kv, LlmRequestState,
                                      lambda req, msg: True)
    stream = _stream(3)
    active: list[LlmRequest] = []
    for k in range(120):
        active += [r for at, r in stream if at == k]
        kv.requests = active
        fitting, _, _ = cap.schedule_request(active)
        assert set(cap.sched.seqs) == {str(r.request_id) for r in active} - cap._rejected
        for r in fitting:
            r.state = LlmRequestState.GENERATION_IN_PROGRESS
            r.generated += 1
        active = [r for r in active if r.generated < r.stop_at and str(r.request_id) not in cap._rejected]
    cap.schedule_request(active)
    assert not active and not cap.sched.seqs and not cap._rejected
    assert cap.sched.counts["finished"] == len(stream) - 1 and cap.sched.counts["rejected"] == 1
    assert cap.sched.used_blocks == 0 and cap.sched.pool.num_free + cap.sched.cache.num_cached_free == 48


class UpstreamSimpleScheduler:
    """``SimpleScheduler.can_schedule`` as upstream writes it: the capacity stage run on the requests asked about."""

    def __init__(self) -> None:
        self.capacity_scheduler: Any = BindCapacityScheduler()

    def can_schedule(self, requests: list) -> bool:
        fitting, _, _ = self.capacity_scheduler.schedule_request(requests)
        return len(fitting) == len(requests)


@pytest.mark.parametrize("path", ["capacity-first", "simple-scheduler"])
def test_can_schedule_is_a_query_that_ends_no_live_request(path: str) -> None:
    """``can_schedule(subset)`` ran the capacity stage on that subset, which ended every live request missing from
    it: their blocks were freed here while the executor still ran them (and a later arrival was admitted into
    them). Now it answers whether the requests fit and changes nothing, on both install paths."""
    kv = KVCacheManager(10)
    if path == "capacity-first":
        inner = KvCacheV2Scheduler()
        inner.can_schedule = lambda requests: True  # type: ignore[attr-defined]
        ex = PyExecutorMain(inner, kv)
    else:
        ex = PyExecutorMain(UpstreamSimpleScheduler(), kv)
    cap = install_with(ex, LlmRequestState, ResourceManagerType, max_num_requests=4)
    a, b = LlmRequest(1, 8, 8, list(range(8))), LlmRequest(2, 8, 8, list(range(50, 58)))  # 4 blocks each
    fits, big = LlmRequest(3, 4, 4, [7, 7, 7, 7]), LlmRequest(4, 8, 8, list(range(90, 98)))  # 2 and 4 blocks
    kv.requests = [a, b]
    fitting, _, _ = cap.schedule_request([a, b])
    assert [r.request_id for r in fitting] == [1, 2]
    before = (list(cap.sched.running), cap.sched.used_blocks, dict(cap.sched.counts), set(cap._live))
    assert ex.scheduler.can_schedule([b]) and ex.scheduler.can_schedule([a, fits])
    assert not ex.scheduler.can_schedule([big]) and not ex.scheduler.can_schedule([fits, big])
    assert (list(cap.sched.running), cap.sched.used_blocks, dict(cap.sched.counts), set(cap._live)) == before
    fitting, _, _ = cap.schedule_request([a, b, big])  # the 2 free blocks do not hold big: a and b still hold 8
    assert [r.request_id for r in fitting] == [1, 2] and cap.sched.counts["admitted"] == 2
