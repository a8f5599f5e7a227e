"""TensorRT-LLM adapter: the decision logic on plain data, the clear error without TensorRT-LLM, and the real
classes where TensorRT-LLM is installed."""

from __future__ import annotations

import importlib.util

import pytest

from trtforge.build_engine.core.errors import BackendError
from trtforge.scheduler.integrations.trtllm import Candidate, decide
from trtforge.scheduler.policies import get_policy

HAS_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None


def test_decide_keeps_running_rejects_never_fit_and_skips_ahead() -> None:
    pol = get_policy("cache-aware", skip_window=2, max_skips=2)
    cands = [Candidate(1, True, 30), Candidate(2, False, 500), Candidate(3, False, 80),
             Candidate(4, False, 10), Candidate(5, False, 10)]
    d = decide(cands, max_blocks=100, max_requests=8, policy=pol)
    assert d.never_fit == [2]
    assert d.scheduled == [1, 4, 5]  # 3 (80 blocks) waits; 4 and 5 go ahead of it
    assert cands[2].skips == 2
    # 3 has now been passed over max_skips times: nobody may pass it until it fits
    d2 = decide([Candidate(1, True, 30), cands[2], Candidate(6, False, 10)], 100, 8, pol)
    assert d2.scheduled == [1]
    d3 = decide([cands[2], Candidate(6, False, 10)], 100, 8, pol)  # the running request finished
    assert d3.scheduled == [3, 6]


def test_decide_respects_max_requests() -> None:
    d = decide([Candidate(i, i < 2, 1) for i in range(6)], 100, 3, get_policy("cache-aware"))
    assert d.scheduled == [0, 1, 2]


@pytest.mark.skipif(HAS_TRTLLM, reason="TensorRT-LLM is installed")
def test_absent_trtllm_gives_clear_error() -> None:
    from trtforge.scheduler.integrations.trtllm import CacheAwareCapacityScheduler, install, patch_executor_creation

    for call in (lambda: install(object()), patch_executor_creation,
                 lambda: CacheAwareCapacityScheduler(None, 8)):
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
