"""When a chunked prompt's blocks become findable by other requests. TensorRT-LLM stores a request's context blocks
for reuse once its context is complete (``KVCacheManager.update_resources``: ``store_context_blocks`` after
``context_remaining_length`` reaches 0), which is when the adapter calls ``Scheduler.context_done``; vLLM v1 caches
each computed full block after every step. The simulator made every chunk's blocks findable at once for every
policy, so a request arriving during a long prefill was credited in the simulator and not by the adapter."""

from __future__ import annotations

import pytest

from trtforge.scheduler.request import Request
from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig

HASHES = tuple(range(1, 6))  # a 20-token prompt: 5 blocks of 4 tokens, 4 of them reusable (never the last token's)


def _run(policy: str) -> Scheduler:
    s = Scheduler(SchedulerConfig(num_blocks=64, tokens_per_block=4, policy=policy, token_budget=8, max_running=4))
    s.submit(Request("a", 0, 20, 4, block_hashes=HASHES, hash_block_tokens=4))
    s.step()  # a's first chunk: 8 of 20 tokens, 2 full blocks computed
    s.submit(Request("b", 0, 20, 4, block_hashes=HASHES, hash_block_tokens=4))
    for _ in range(3):
        s.step()
    return s


@pytest.mark.parametrize("policy", ["trtllm-main-no-evict", "trtllm-1.2-no-evict", "cache-aware", "max-utilization"])
def test_tensorrt_llm_policies_find_a_prefix_once_its_context_completes(policy: str) -> None:
    s = _run(policy)
    assert s.seqs["a"].computed == 20 and s.state("b") == "running"
    assert s.seqs["b"].hits == 0  # admitted while a's context was still running: nothing stored yet
    c = Request("c", 0, 20, 4, block_hashes=HASHES, hash_block_tokens=4)
    s.submit(c)
    s.step()
    assert s.seqs["c"].hits == 4  # after a's context completed, its 4 reusable blocks are found


def test_vllm_v1_finds_each_computed_block_at_once() -> None:
    s = _run("vllm-v1")
    assert s.seqs["b"].hits == 4  # admitted at step 3, when a had computed 16 tokens (4 full blocks)
