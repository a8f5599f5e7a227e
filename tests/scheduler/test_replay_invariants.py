"""Held-out QA: scheduler invariants checked after every step of simulator replays (every policy that rejects
never-fit requests, one replica and routed replicas, LoRA slots) over adversarial traces built here and slices of
the real traces; and trace fields that int()/float() read but that are not plain numbers."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig, StepPlan
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel
from trtforge.scheduler.sim.summary import SimSummary
from trtforge.scheduler.sim.traces import read_azure_csv, read_mooncake_jsonl
from trtforge_testing import SHARED

MODEL = StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])
POLICIES = ["trtllm-main-no-evict", "max-utilization", "vllm-v1", "cache-aware"]  # 1.2 waits on never-fit: by design
TRACES = SHARED / "traces"


def check_invariants(s: Scheduler) -> None:
    """Blocks used + free == total, no block owned twice by one request, every block's reference count equals
    its live holders, and no running request holds fewer blocks than the K/V it has written."""
    tpb, total = s.config.tokens_per_block, s.config.num_blocks
    holders: dict[int, int] = {}
    for seq in s.running.values():
        assert len(set(seq.blocks)) == len(seq.blocks), seq.req.id
        for b in seq.blocks:
            holders[b] = holders.get(b, 0) + 1
        # a decode step writes the previous token's K/V: prompt + generated - 1 tokens while decoding
        kv = seq.req.prompt_tokens + seq.generated(s.step_no) - 1 if seq.decoding else seq.computed
        assert len(seq.blocks) >= math.ceil(kv / tpb), (seq.req.id, len(seq.blocks), kv)
    for b in range(total):
        assert s.pool.ref_count[b] == holders.get(b, 0), b
        assert b not in holders or not s.pool.is_free(b)
    assert len(holders) + s.pool.num_free + s.cache.num_cached_free == total
    assert s.used_blocks == len(holders)
    assert all(q.state == "queued" and not q.blocks for q in s.queue.values())


class CheckedScheduler(Scheduler):
    """The real Scheduler, checking ``check_invariants`` after each step, skip and finish the replay drives."""

    def step(self) -> StepPlan:
        plan = super().step()
        check_invariants(self)
        return plan

    def skip(self, steps: int) -> None:
        super().skip(steps)
        check_invariants(self)

    def finish(self, request_id: str) -> None:
        super().finish(request_id)
        check_invariants(self)


def _replay(reqs: list[Request], policy: str, replicas: int, router: str, max_tokens: str,
            blocks: int = 64, tpb: int = 16, max_seq: int = 2048, **kw: object) -> SimSummary:
    cfg = SchedulerConfig(num_blocks=blocks, tokens_per_block=tpb, policy=policy, max_seq_len=max_seq,
                          token_budget=512, max_running=16, **kw)  # type: ignore[arg-type]
    sm = simulate(reqs, lambda: CheckedScheduler(cfg), MODEL, replicas=replicas, router=router,
                  max_tokens=max_tokens, horizon_s=1e6).summary
    # bounded and complete: every request ends finished or rejected (never queued forever)
    assert sm.completed + sm.rejected == len(reqs) and sm.unserved == 0 and sm.stuck == 0, sm
    # only requests that can never run are rejected, each under the limit it exceeds
    assert set(sm.rejected_by_kind) <= {"prompt-too-long", "kv-never-fits"}
    assert sum(sm.rejected_by_kind.values()) == sm.rejected
    return sm


def _adversarial(kind: str, rng: random.Random, n: int = 40, tpb: int = 16) -> list[Request]:
    out = []
    for i in range(n):
        t = {"burst": 0.0, "unsorted": rng.uniform(0, 5)}.get(kind, i * 0.01)
        p, o = rng.randint(1, 600), rng.randint(1, 300)
        if kind == "boundary":
            p, o = tpb * rng.randint(1, 8), tpb * rng.randint(1, 4)
        elif kind == "one-over":
            p, o = tpb * rng.randint(1, 8) + 1, 1
        elif kind == "max-length":
            p, o = 2047, 1  # fits max_seq_len, never the 64-block pool: rejected
        elif kind == "huge-output":
            p, o = 10, 5000
        hashes: tuple[int, ...] = ()
        if kind == "duplicate-hashes":
            hashes = (5,) * (p // 16 + 2)
        elif kind in ("diverge", "burst"):
            hashes = tuple([1, 2, 3][:rng.randint(0, 3)] + [100 + i])
        out.append(Request(f"{kind}-{i}", t, p, o, block_hashes=hashes, hash_block_tokens=rng.choice([16, 32])))
    return out


KINDS = ["boundary", "one-over", "max-length", "huge-output", "duplicate-hashes", "diverge", "burst", "unsorted"]


@pytest.mark.parametrize("kind", KINDS)
def test_invariants_on_adversarial_traces(kind: str) -> None:
    reqs = _adversarial(kind, random.Random(KINDS.index(kind)))
    for policy in POLICIES:
        for replicas, router in [(1, "round-robin"), (3, "prefix-affinity"), (3, "cache-aware")]:
            for max_tokens in ("2048", "oracle"):
                sm = _replay(reqs, policy, replicas, router, max_tokens)
                if kind == "max-length":  # 2047 + cap 2048 > max_seq_len; 2047 + 1 > the 64 x 16-token pool
                    limit = "prompt-too-long" if max_tokens == "2048" else "kv-never-fits"
                    assert sm.rejected_by_kind == {limit: len(reqs)}


@pytest.mark.parametrize("name", ["azure_llm_2023_conv.csv", "mooncake_conversation_trace.jsonl"])
def test_invariants_on_real_trace_slices(name: str) -> None:
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    reader = read_azure_csv if name.endswith(".csv") else read_mooncake_jsonl
    reqs = reader(path, max_requests=9200)[9000:]  # a slice the other tests never replay
    reqs = [replace(r, adapter=("a", "b", None)[k % 3]) for k, r in enumerate(reqs)]
    for policy in POLICIES:
        for replicas, router in [(1, "round-robin"), (2, "cache-aware")]:
            _replay(reqs, policy, replicas, router, "2048", blocks=600, tpb=32, max_seq=32768, lora_slots=1,
                    adapters=("a", "b"))


@pytest.mark.parametrize("value", ["1_000", "\u0665", "+5"])
def test_csv_token_count_must_be_ascii_digits(tmp_path, value: str) -> None:
    # int() reads '1_000' as 1000 and '\u0665' (Arabic-Indic five) as 5: a silent misreading of a malformed row
    p = tmp_path / "t.csv"
    p.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,{value},3\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"t\.csv:2: ContextTokens must be an integer"):
        read_azure_csv(p)
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1, 12 ,3\n", encoding="utf-8")
    assert [r.prompt_tokens for r in read_azure_csv(p)] == [12]  # spaces after a comma are not a malformed field


@pytest.mark.parametrize("frac", ["1e5", "1_5", "5e-1"])
def test_csv_timestamp_fraction_must_be_digits(tmp_path, frac: str) -> None:
    # float('0.1e5') is 10000: '18:15:46.1e5' was read as 46 s + 10,000 s
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:40.0,5,3\n"
                 f"2023-11-16 18:15:46.{frac},5,3\n")
    with pytest.raises(InputError, match=r"t\.csv:3: TIMESTAMP .* is not 'YYYY-MM-DD HH:MM:SS\[\.fraction\]'"):
        read_azure_csv(p)
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:40.0,5,3\n2023-11-16 18:15:46.25,5,3\n")
    assert [r.arrival for r in read_azure_csv(p)] == [0.0, 6.25]


def test_never_fit_reason_names_the_limit() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, tokens_per_block=16, max_seq_len=2048, token_budget=512,
                                  max_running=16))
    kv = s.submit(Request("kv", 0.0, 1024, 1))  # 1025 tokens: 65 blocks of a 64-block pool
    seq = s.submit(Request("seq", 0.0, 2047, 2))  # 2049 tokens > max_seq_len 2048
    assert kv.status == seq.status == "rejected" and kv.reason is not None and seq.reason is not None
    assert kv.reason.kind == "kv-never-fits"
    assert "65 KV blocks" in kv.reason.message and "64 blocks" in kv.reason.message
    assert seq.reason.kind == "prompt-too-long" and "2048" in seq.reason.message
    assert not s.queue and s.step().num_tokens == 0


def test_mooncake_row_with_more_hash_ids_than_blocks_is_refused(tmp_path) -> None:
    """One hash id per 512-token prompt block: 3 ids for a 1,024-token prompt (2 blocks) is a malformed row."""
    from trtforge.scheduler.sim.traces import read_mooncake_jsonl

    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 1025, "output_length": 4, "hash_ids": [1, 2, 3]}\n'
                 '{"timestamp": 5, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2, 3]}\n')
    with pytest.raises(InputError, match=r"t\.jsonl:2: 3 hash_ids for input_length 1024: at most 2"):
        read_mooncake_jsonl(p)
    p.write_text('{"timestamp": 0, "input_length": 1025, "output_length": 4, "hash_ids": [1, 2, 3]}\n')
    assert [r.block_hashes for r in read_mooncake_jsonl(p)] == [(1, 2, 3)]
