"""Held-out QA (session 26): the TensorRT-LLM adapter against the real simulator (``simulate()``, its event loop,
end-of-sequence and fast-forward included), state by state: which requests run, each one's blocks, the prefix
cache's LRU order, the free list and the LoRA slots, on streams with few LoRA slots and same-step ends."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

from trtforge.scheduler.integrations.trtllm import CacheAwareCapacityScheduler
from trtforge.scheduler.kv_plan import PRESETS
from trtforge.scheduler.request import Request, hashes_from_tokens
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig, SubmitResult
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trtllm_adapter import TPB, KVCacheManager, LlmRequest, LlmRequestState  # noqa: E402

Snapshot = tuple[Any, ...]


class OneSecondSteps(StepTimeModel):
    """Every step takes 1 s, so the adapter's iterations line up with the simulator's steps."""

    def step_seconds(self, context_chunks: list[tuple[int, int]], decode_contexts_sum: int,
                     num_decode: int) -> float:
        return 1.0

    def decode_seconds(self, decode_contexts_sum: int, num_decode: int) -> float:
        return 1.0 if num_decode else 0.0

    def prefill_seconds(self, start: int, end: int, chunk: int) -> float:
        return 1.0


MODEL = OneSecondSteps(PRESETS["llama-3.1-8b"], 1.0, 1.0)


class Recorded(Scheduler):
    """The real Scheduler, recording its state after each admission pass and the step each request arrived at."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.log: dict[int, Snapshot] = {}
        self.submitted_at: dict[str, int] = {}
        self.iteration = 0

    def submit(self, req: Request) -> SubmitResult:
        self.submitted_at[req.id] = self.step_no
        return super().submit(req)

    def admit(self) -> list[str]:
        out = super().admit()
        self.log[max(self.step_no, self.iteration)] = (
            tuple(self.running), tuple(tuple(q.blocks) for q in self.running.values()), tuple(self.queue),
            tuple(self.cache._lru), tuple(self.pool._free), tuple(sorted(self.lora.slot_of.items())))
        return out


def _config(policy: str, blocks: int = 48, slots: int = 2, adapters: int = 3) -> SchedulerConfig:
    return SchedulerConfig(num_blocks=blocks, tokens_per_block=TPB, policy=policy, token_budget=4096, max_running=6,
                           skip_window=3, max_skips=4, lora_slots=slots,
                           adapters=tuple(f"lora-{k}" for k in range(adapters)), max_seq_len=1024)


def _stream(seed: int, cap: int, adapters: int, n: int = 60) -> list[tuple[float, LlmRequest]]:
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(12)]
    out = []
    for i in range(n):
        prompt = system[:rng.choice([0, 8, 12])] + [rng.randrange(1000) for _ in range(rng.randrange(1, 30))]
        task = rng.choice([None, None, *range(adapters)])
        out.append(((i // 3) + i * 1e-6, LlmRequest(i, len(prompt), cap, prompt, lora_task_id=task,
                                                    stop_at=rng.randrange(1, cap + 6))))
    return out


def _simulated(stream: list[tuple[float, LlmRequest]], cfg: SchedulerConfig, cap: int) -> Recorded:
    reqs = [Request(str(r.request_id), at, r.prompt_len, r.stop_at, hashes_from_tokens(r.tokens, TPB), TPB,
                    adapter=None if r.lora_task_id is None else f"lora-{r.lora_task_id}") for at, r in stream]
    made: list[Recorded] = []
    simulate(reqs, lambda: made.append(Recorded(cfg)) or made[-1], MODEL, max_tokens=str(cap), horizon_s=1e6)
    return made[0]


def _deployed(stream: list[tuple[float, LlmRequest]], cfg: SchedulerConfig, submitted_at: dict[str, int],
              iterations: int) -> tuple[Recorded, list[int]]:
    """A fake executor loop (one token per fitting request per iteration) fed each request at the step the
    simulator submitted it."""
    kv = KVCacheManager(cfg.num_blocks)
    sched = Recorded(cfg)
    rejected: list[int] = []
    cap = CacheAwareCapacityScheduler(sched, kv, LlmRequestState,
                                      lambda req, msg: rejected.append(req.request_id) or True)
    active: list[LlmRequest] = []
    for k in range(1, iterations + 1):
        active += [r for _, r in stream if submitted_at[str(r.request_id)] == k - 1]
        kv.requests = active
        sched.iteration = k
        fitting, _, _ = cap.schedule_request(active)
        for r in fitting:
            r.generated += 1
            r.state = LlmRequestState.GENERATION_IN_PROGRESS
            if r.generated >= min(r.stop_at, r.max_new_tokens):
                r.state = LlmRequestState.GENERATION_COMPLETE
        active = [r for r in active if r.state != LlmRequestState.GENERATION_COMPLETE and r.request_id not in rejected]
    return sched, rejected


@pytest.mark.parametrize("policy", ["cache-aware", "trtllm-main-no-evict", "trtllm-1.2-no-evict"])
@pytest.mark.parametrize(("seed", "blocks", "slots", "adapters"), [(0, 48, 2, 3), (1, 48, 1, 3), (2, 20, 2, 3),
                                                                   (3, 48, 1, 1), (4, 32, 3, 6)])
def test_adapter_state_equals_the_simulators_step_by_step(policy: str, seed: int, blocks: int, slots: int,
                                                          adapters: int) -> None:
    # held-out QA: requests ending by end-of-sequence in one step were freed by the simulator in (step, request id
    # as a string) order ('10' before '9'; those at their first token first) and by the adapter in arrival order;
    # the free order is the LRU order, so the cached prefixes later requests found differed (27 of 40 such streams
    # diverged, in blocks and LRU order first). Both now free in admission order.
    cfg = _config(policy, blocks, slots, adapters)
    sim = _simulated(_stream(seed, 8, adapters), cfg, 8)
    dep, rejected = _deployed(_stream(seed, 8, adapters), cfg, sim.submitted_at, sim.step_no + 2)
    assert sim.log and set(sim.log) <= set(dep.log)
    for step, state in sorted(sim.log.items()):
        assert dep.log[step] == state, step
    assert sorted(rejected) == sorted(int(r) for r, q in sim.seqs.items() if q.state == "rejected")
    assert sum(q.state == "finished" for q in sim.seqs.values()) > 30


def test_same_step_end_of_sequence_frees_in_admission_order() -> None:
    # '9' is admitted before '10' and both reach end-of-sequence in the same step: the simulator freed '10' first
    # (its heap compared ids as strings), so '10''s cached prefix was kept longer than '9''s in the LRU
    cfg = SchedulerConfig(num_blocks=16, tokens_per_block=TPB, policy="cache-aware", max_running=4)
    made: list[Scheduler] = []
    reqs = [Request("9", 0.0, 9, 3, (1, 2), TPB), Request("10", 0.0, 9, 3, (3, 4), TPB)]
    simulate(reqs, lambda: made.append(Scheduler(cfg)) or made[-1], MODEL, max_tokens="8", horizon_s=60)
    s = made[0]
    assert s.counts["finished"] == 2 and s.seqs["9"].order < s.seqs["10"].order
    assert list(s.cache._lru) == [1, 0, 6, 5]  # 9's prompt blocks (of [0..4]) first: reclaimed first; then 10's
