"""A small replay's summary pinned (issue 13, round 2): the simulator's speed work must leave every result
bit-identical. ``replay_pinned.json`` was written by ``_cases()`` below BEFORE that work; regenerate it
(``python tests/scheduler/test_replay_pinned.py``) only for a change that is meant to alter results, and say so."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel
from trtforge.scheduler.sim.traces import assign_adapters, synthetic_trace

PINNED = Path(__file__).parent / "data" / "replay_pinned.json"
POLICIES = ("cache-aware", "trtllm-main-no-evict", "trtllm-1.2-no-evict", "max-utilization", "vllm-v1")
# (replicas, router): one replica, and two behind each router (the cache-aware router is pinned as of round 2)
SETUPS = ((1, "round-robin"), (2, "round-robin"), (2, "prefix-affinity"), (2, "cache-aware"))


def _case(policy: str, replicas: int, router: str) -> dict[str, Any]:
    # KV-starved on purpose (600 blocks of 64 tokens against ~2k-token prompts): preemption, LRU reclaim,
    # rejection of never-fit prompts and a LoRA slot pool all take part
    reqs = assign_adapters(synthetic_trace(220, rate=5.0, seed=11), 3, seed=2)
    cfg = SchedulerConfig(num_blocks=600, tokens_per_block=64, policy=policy, max_running=24, lora_slots=2,
                          adapters=("adapter-0", "adapter-1", "adapter-2"), max_seq_len=32768)
    model = StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])
    return simulate(reqs, partial(Scheduler, cfg), model, replicas=replicas, router=router,
                    horizon_s=120).summary.to_json()


def _key(policy: str, replicas: int, router: str) -> str:
    return f"{policy}/{replicas}/{router}"


@pytest.mark.parametrize("policy", POLICIES)
def test_replay_summary_is_pinned(policy: str) -> None:
    pinned = json.loads(PINNED.read_text())
    for replicas, router in SETUPS:
        got = json.loads(json.dumps(_case(policy, replicas, router)))  # the --json round trip
        assert got == pinned[_key(policy, replicas, router)], (policy, replicas, router)
    assert pinned[_key(policy, 1, "round-robin")]["completed"] > 50


if __name__ == "__main__":
    out = {_key(p, n, r): _case(p, n, r) for p in POLICIES for n, r in SETUPS}
    PINNED.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    sys.exit(0)
