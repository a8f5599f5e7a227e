"""Held-out QA (session 26): ``simulate``'s metrics recomputed here from the step model and from per-request
times (seconds, as the ``*_s`` keys say)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from trtforge.profiles.loader import load_profile
from trtforge.scheduler.kv_plan import PRESETS
from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
from trtforge.scheduler.sim.simulator import simulate
from trtforge.scheduler.sim.step_time import StepTimeModel
from trtforge.scheduler.sim.traces import synthetic_trace

MODEL = StepTimeModel.from_profile(load_profile("h100"), PRESETS["llama-3.1-8b"])
CFG = SchedulerConfig(num_blocks=3000, tokens_per_block=64, max_running=16, max_seq_len=32768)


@pytest.mark.parametrize(("prompt", "out"), [(20000, 10), (9000, 5), (1000, 50)])
def test_alone_ttft_is_its_prefill_and_tpot_its_decode_steps(prompt: int, out: int) -> None:
    # the step time read the decode context after the step: the step that ran a prompt's last chunk was costed
    # with that prompt's context read again (TTFT 0.712058 s for 20,000 tokens, its prefill is 0.712038 s), and
    # the step in which a request reached its cap without its context (the last decode of a 20k-token request at
    # context 0: TPOT 0.008862 s, its decode steps take 0.008971 s)
    reqs = [Request(f"r{i}", 1000.0 * i, prompt, out) for i in range(3)]  # far apart: each one alone
    sm = simulate(reqs, partial(Scheduler, CFG), MODEL, max_tokens="oracle", horizon_s=100).summary
    assert sm.completed == 3
    assert sm.ttft_p50_s == pytest.approx(MODEL.prefill_seconds(0, prompt, CFG.token_budget), rel=1e-9)
    # decode step k (1..out-1) attends to the prompt and the k tokens generated before it
    decode = [MODEL.decode_seconds(prompt + k, 1) for k in range(1, out)]
    assert sm.tpot_p50_s == pytest.approx(sum(decode) / len(decode), rel=1e-9)
    assert sm.throughput_tok_s * sm.duration_s == pytest.approx(3 * out)


def test_summary_percentiles_and_rates_from_the_per_request_times() -> None:
    reqs = synthetic_trace(40, rate=2.0, seed=3, prompt_median=800, output_median=40)
    res = simulate(reqs, partial(Scheduler, CFG), MODEL, max_tokens="2048", horizon_s=600)
    sm = res.summary
    assert sm.completed == 40 and sm.unserved == 0 and len(res.ttfts) == 40
    assert sm.ttft_p50_s == pytest.approx(float(np.percentile(res.ttfts, 50)), rel=1e-12)
    assert sm.ttft_p99_s == pytest.approx(float(np.percentile(res.ttfts, 99)), rel=1e-12)
    window = reqs[-1].arrival - reqs[0].arrival + 600
    assert sm.duration_s == pytest.approx(window)
    assert sm.req_per_s == pytest.approx(40 / window)
    assert sm.throughput_tok_s == pytest.approx(sum(r.max_new_tokens for r in reqs) / window)
    assert 0.0 < sm.ttft_p50_s < 1.0 and 0.005 < sm.tpot_p50_s < 0.05  # seconds: ms-scale steps on an H100


def test_plot_ttfts_are_the_first_tokens_inside_the_window() -> None:
    """The plot's TTFT CDF (``SimResult.ttfts``) held every first token, also one the window's last step produced
    after the window ended, which the summary counts as unserved: with no horizon the window ends at the last
    arrival (10 s), and the prefill step of a prompt that arrived 5 ms earlier (about 15 ms long) ends after it."""
    prefill = MODEL.prefill_seconds(0, 500, CFG.token_budget)
    reqs = [Request("early", 0.0, 500, 5), Request("straddles", 10.0 - prefill / 3, 500, 5),
            Request("last", 10.0, 500, 5)]
    res = simulate(reqs, partial(Scheduler, CFG), MODEL, max_tokens="oracle", horizon_s=0.0)
    assert res.summary.unserved >= 1  # "straddles" has no first token inside the window
    assert res.ttfts == [pytest.approx(prefill, rel=1e-9)]  # "early" only
