"""Held-out QA round 7: prefix-cache hits and LRU eviction against a plain reference; block counts of huge caps."""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import partial

import pytest

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel
from trtforge_testing import seeded_rng

HB = 512  # Mooncake's hash block


def _identities(r: Request, tpb: int) -> list[tuple[tuple[int, ...], int]]:
    """What block i of ``r`` holds: the trace ids up to the one covering its last token (chained: equal ids mean
    equal prefix), and its offset. Only blocks the ids cover completely."""
    covered = min(r.prompt_tokens, len(r.block_hashes) * HB)
    return [(r.block_hashes[:((i + 1) * tpb - 1) // HB + 1], i * tpb) for i in range(covered // tpb)]


def _reference_hit_rate(reqs: list[Request], tpb: int, blocks: int) -> float:
    """Requests one at a time (each ends before the next arrives), reserve to completion: a hit is the longest cached
    prefix short of the block with the last prompt token; fresh blocks come from never-cached ones first, then the
    least recently freed cached one is evicted; a computed block is cached unless its content already is; a request
    frees its blocks tail first (so its prefix is evicted last)."""
    free, lru = blocks, OrderedDict[tuple[tuple[int, ...], int], None]()
    hits = queries = 0
    for r in reqs:
        ids = _identities(r, tpb)
        usable = min(len(ids), (r.prompt_tokens - 1) // tpb)
        h = 0
        while h < usable and ids[h] in lru:
            h += 1
        hits, queries = hits + h, queries + usable
        held: list[tuple[tuple[int, ...], int] | None] = []
        for i in range(h):
            del lru[ids[i]]
            held.append(ids[i])
        for _ in range(math.ceil((r.prompt_tokens + r.max_new_tokens) / tpb) - h):
            if free:
                free -= 1
            else:
                lru.popitem(last=False)
            held.append(None)
        for i in range(h, len(ids)):
            if ids[i] not in lru and ids[i] not in held:
                held[i] = ids[i]
        for b in reversed(held):
            if b is None:
                free += 1
            else:
                lru[b] = None
    return hits / queries if queries else 0.0


@pytest.mark.parametrize("case", range(16))
def test_prefix_hits_and_lru_eviction_equal_a_plain_reference(case: int) -> None:
    """Conversations that extend shared prefixes in a pool small enough to evict (prompts ending on, one short of and
    inside a 512-token block; scheduler blocks of 64-256 tokens): the replay's prefix hit rate is the reference's."""
    rng = seeded_rng(f"prefix-reference-{case}")
    tpb, nb = int(rng.choice([64, 128, 256])), int(rng.integers(20, 60))
    history: list[tuple[int, ...]] = [(1, 2), (1, 3), (4,)]
    reqs = []
    for k in range(int(rng.integers(2, 25))):
        c, n = int(rng.integers(0, 3)), int(rng.integers(1, 5))
        ids = history[c][:n] + tuple(1000 * k + j for j in range(max(0, n - len(history[c]))))
        history[c] = ids
        prompt = max(1, min(len(ids) * HB, nb * tpb - 8) - int(rng.choice([0, 1, rng.integers(2, 100)])))
        reqs.append(Request(f"r{k}", 100.0 * k, prompt, int(rng.integers(1, 6)), block_hashes=ids[:-(-prompt // HB)],
                            hash_block_tokens=HB))
    cfg = SchedulerConfig(num_blocks=nb, tokens_per_block=tpb, policy="cache-aware")
    model = StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])
    res = simulate(reqs, partial(Scheduler, cfg), model, horizon_s=100, max_tokens="oracle")
    assert res.summary.completed == len(reqs)
    assert res.summary.prefix_hit_rate == pytest.approx(_reference_hit_rate(reqs, tpb, nb), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("digits", [320, 4000])
def test_a_cap_past_float_range_is_rejected_not_a_crash(cli, digits: int) -> None:
    """--max-tokens of 320 (or up to 4300) digits: the block count of a request was math.ceil(total / block),
    a float division, which overflowed (exit 3); every request is now rejected as longer than the context."""
    cap = "1" + "".join(str(int(d)) for d in seeded_rng(f"cap-{digits}").integers(0, 10, digits))
    res = cli("simulate", "--trace", "synthetic:3", "--profile", "h100", "--model", "llama-3.1-8b",
              "--policy", "cache-aware", "--max-tokens", cap, "-q")
    assert res.code == 0, res.err
    assert '"rejected": 3' in res.out


def test_a_cap_of_more_than_4300_digits_is_one_line_exit_2(cli) -> None:
    """int() reads no more than 4300 digits: the --max-tokens check raised ValueError (exit 3)."""
    from trtforge_testing import assert_one_line_error

    cap = "9" * int(seeded_rng("cap-digits").integers(4301, 6000))
    res = cli("simulate", "--trace", "synthetic:3", "--profile", "h100", "--model", "llama-3.1-8b",
              "--policy", "cache-aware", "--max-tokens", cap)
    assert_one_line_error(res, 2, "--max-tokens", "4300 digits")


def test_blocks_needed_are_exact_past_2_to_the_53() -> None:
    """A request's blocks were math.ceil(tokens / block) in floats: past 2**53 tokens the count was off (2**53 + 3
    tokens of one-token blocks: 2**53 + 4 blocks). Integer arithmetic now, in the reject reason too."""
    rng = seeded_rng("exact-blocks")
    for tpb in (1, 16, 64):
        prompt, new = int(rng.integers(1, 1000)), 2**53 + int(rng.integers(1, 1000))
        s = Scheduler(SchedulerConfig(num_blocks=8, tokens_per_block=tpb, max_seq_len=2**60))
        req = Request("big", 0.0, prompt, new)
        exact = (prompt + new + tpb - 1) // tpb
        assert s.blocks_needed(req) == exact
        res = s.submit(req)
        assert res.reason is not None and res.reason.kind == "kv-never-fits" and res.reason.blocks_needed == exact
