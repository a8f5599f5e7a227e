"""Trace readers on small files written here, and on the first lines of the real traces when they are present."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.scheduler.sim.traces import load_trace, read_azure_csv, read_mooncake_jsonl, synthetic_trace
from trtforge_testing import SHARED

TRACES = SHARED / "traces"


def test_azure_csv(tmp_path) -> None:
    rng = random.Random(7)
    rows = [(rng.randrange(1, 5000), rng.randrange(0, 900)) for _ in range(5)]
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{40 + k:02d}.{rng.randrange(10**7):07d},{c},{g}\n" for k, (c, g) in enumerate(rows))
    p = tmp_path / "a.csv"
    p.write_text(text)
    reqs = read_azure_csv(p)
    assert [(r.prompt_tokens, r.max_new_tokens) for r in reqs] == [(c, max(1, g)) for c, g in rows]
    assert reqs[0].arrival == 0.0 and 3.0 < reqs[-1].arrival < 5.0
    assert all(not r.block_hashes for r in reqs)


def test_azure_csv_errors(tmp_path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,5\n2023-11-16 18:15:47.1,x,5\n")
    with pytest.raises(InputError, match=r"bad.csv:3: ContextTokens"):
        read_azure_csv(p)
    p.write_text("time,in,out\n")
    with pytest.raises(InputError, match=r"bad.csv:1: header"):
        read_azure_csv(p)
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
    with pytest.raises(InputError, match=r"bad.csv:2: TIMESTAMP"):
        read_azure_csv(p)


def test_mooncake_jsonl(tmp_path) -> None:
    lines = [{"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]},
             {"timestamp": 2500, "input_length": 600, "output_length": 3, "hash_ids": [0, 3]}]
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    reqs = read_mooncake_jsonl(p)
    assert reqs[1].arrival == 2.5 and reqs[1].block_hashes == (0, 3) and reqs[1].hash_block_tokens == 512
    p.write_text(json.dumps(lines[0]) + "\n{\"timestamp\": 1, \"input_length\": 5}\n")
    with pytest.raises(InputError, match=r"m.jsonl:2: missing key 'output_length'"):
        read_mooncake_jsonl(p)
    p.write_text(json.dumps(lines[0]) + "\nnot json\n")
    with pytest.raises(InputError, match=r"m.jsonl:2: not valid JSON"):
        read_mooncake_jsonl(p)
    with pytest.raises(InputError, match="unknown trace format"):
        load_trace(str(tmp_path / "x.parquet"))


def test_synthetic_is_deterministic_and_shares_prefixes() -> None:
    a, b, c = synthetic_trace(300, seed=3), synthetic_trace(300, seed=3), synthetic_trace(300, seed=4)
    assert a == b and a != c
    assert all(x.arrival < y.arrival for x, y in itertools.pairwise(a))
    assert all(r.block_hashes[:2] == (0, 1) for r in a)  # the shared system prompt
    firsts = {r.block_hashes[:3] for r in a}
    assert len(firsts) < len(a)  # conversations repeat their earlier turns


@pytest.mark.skipif(not TRACES.exists(), reason="../shared/traces not present")
def test_real_traces_first_lines() -> None:
    az = read_azure_csv(TRACES / "azure_llm_2023_conv.csv", max_requests=50)
    assert len(az) == 50 and az[0].prompt_tokens == 374 and az[0].max_new_tokens == 44
    mc = read_mooncake_jsonl(TRACES / "mooncake_conversation_trace.jsonl", max_requests=50)
    assert len(mc) == 50 and mc[0].prompt_tokens == 6758 and mc[0].block_hashes[:2] == (0, 1)
    assert all(len(r.block_hashes) == -(-r.prompt_tokens // 512) for r in mc)


def test_unsorted_rows_arrive_from_the_earliest(tmp_path) -> None:
    """Rows out of time order: arrivals are seconds from the earliest request (none negative), in time order."""
    jl = tmp_path / "t.jsonl"
    jl.write_text("".join(json.dumps({"timestamp": ts, "input_length": 10, "output_length": 2}) + "\n"
                          for ts in (5000, 0, 2500)))
    assert [(r.id, r.arrival) for r in read_mooncake_jsonl(jl)] == [("mooncake-1", 0.0), ("mooncake-2", 2.5),
                                                                  ("mooncake-0", 5.0)]
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:50.5,10,2\n"
                        "2023-11-16 18:15:46.5,20,2\n")
    assert [(r.id, r.arrival) for r in read_azure_csv(csv_path)] == [("azure-1", 0.0), ("azure-0", 4.0)]


def test_hash_ids_python_hashes_alike_stay_apart(tmp_path) -> None:
    """hash(-1) == hash(-2) and hash(2**61 - 1) == hash(0): such Mooncake ids made requests with different prompts
    share prefix blocks; they are renumbered (equal ids stay equal), and ordinary ids are kept as they are."""
    from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig

    jl = tmp_path / "t.jsonl"
    ids = [[-1, 7], [-2, 8], [2**61 - 1, 9], [0, 10], [-1, 7]]
    jl.write_text("".join(json.dumps({"timestamp": i, "input_length": 1024, "output_length": 4, "hash_ids": h}) + "\n"
                          for i, h in enumerate(ids)))
    reqs = read_mooncake_jsonl(jl)
    assert [r.block_hashes for r in reqs] == [(0, 1), (2, 3), (4, 5), (6, 7), (0, 1)]
    s = Scheduler(SchedulerConfig(num_blocks=1000, tokens_per_block=64, policy="cache-aware"))
    hits = []
    for r in reqs:
        s.submit(r)
        while s.seqs[r.id].computed < r.prompt_tokens:
            s.step()
        hits.append(s.seqs[r.id].hits)
    assert hits == [0, 0, 0, 0, 15]  # only the repeat of the first prompt hits (all but its last token's block)
    plain = tmp_path / "p.jsonl"
    plain.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [5, 2**40]}))
    assert read_mooncake_jsonl(plain)[0].block_hashes == (5, 2**40)
