"""The response cache, held-out QA round 4, against a real redis-server: an answer longer than the server's
``proto-max-bulk-len`` is not sent (Redis answered its SET with a protocol error and closed the connection: the tier
went down as an outage, the whole flush was dropped, and the next lookups missed); L3 scores true cosines of an
embedding that does not normalise (an unrelated question scored 2.2 and was served another one's answer)."""

from __future__ import annotations

import numpy as np
import pytest

from trtforge.scheduler.cache.entry import CacheConfig
from trtforge.scheduler.cache.front import ResponseCache
from trtforge.scheduler.cache.l3 import ngram_embedding

from .conftest import start_redis

pytest.importorskip("prometheus_client", reason="cache metrics need prometheus_client (trtforge[sim])")


def _req(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0}


def test_an_answer_over_the_bulk_limit_does_not_take_the_tier_down() -> None:
    server = start_redis(None, "--proto-max-bulk-len", "1mb")  # Redis' smallest allowed limit
    rc = ResponseCache(CacheConfig(layers=("l1", "l2"), redis_url=server.url, flush_interval_s=60))
    try:
        assert rc.l2 is not None and rc.l2.max_value_bytes == 2**20
        reqs = [_req(f"question {i}") for i in range(3)]
        for i, r in enumerate(reqs):
            rc.store(rc.lookup(r).key, "x" * (2 * 2**20 if i == 1 else 10))
        assert rc.l2.flush() == 2  # the two others went out in one flush
        assert rc.l2.up and rc.l2.dropped == 1
        assert rc.metrics is not None
        assert rc.metrics.dropped.labels(reason="too_large")._value.get() == 1
        rc.l1.clear()
        got = [rc.lookup(r) for r in reqs]
        assert [g.layer for g in got] == ["l2", None, "l2"]
        assert got[0].value == "x" * 10 and got[2].value == "x" * 10
    finally:
        rc.close()
        server.stop()


def test_l3_scores_cosines_of_an_encoder_that_does_not_normalise() -> None:
    """An embedding whose vectors are not unit length (sentence-transformers' default): its inner products are not
    cosines; an unrelated question scored 2.2 against the 0.9 threshold and was served another one's answer."""
    pytest.importorskip("faiss", reason="L3 needs faiss-cpu")
    base = ngram_embedding(256)

    def embed(text: str) -> np.ndarray:
        return base(text) * (3.0 + len(text) / 10)

    rc = ResponseCache(CacheConfig(layers=("l1", "l3"), l3_threshold=0.9), embed=embed)
    first = _req("What is the capital city of France, please tell me")
    rc.store(rc.lookup(first).key, "Paris")
    assert rc.lookup(_req("How do I bake sourdough bread at home")).layer is None
    near = rc.lookup(_req("What is the capital city of France, please tell me!"))
    assert near.layer == "l3" and near.value == "Paris" and 0.9 <= near.similarity <= 1.0 + 1e-5


def test_a_completions_prompt_never_shares_a_chat_messages_key() -> None:
    """{"prompt": "Hello"} (completions: the model continues the raw text) and a chat request whose one user message
    is "Hello" (answered through the chat template) had one key and one L3 scope: one was served the other's
    answer. Chat keys are unchanged; equal prompts still share theirs."""
    from trtforge.scheduler.cache.keys import _CANONICAL, _canonical_fields, _encode_canonical, make_key

    chat = {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "temperature": 0}
    completion = {"model": "m", "prompt": "Hello", "temperature": 0}
    assert make_key(chat).digest != make_key(completion).digest
    assert make_key(chat).scope != make_key(completion).scope
    assert make_key(completion).digest == make_key({**completion, "prompt": " Hello \r\n", "id": "x"}).digest
    assert _encode_canonical(_canonical_fields(completion)) == _CANONICAL(_canonical_fields(completion))
    assert make_key(chat).digest == "a76fec12b3d6d6097303e5f29d9dc8c8b5d27fc2ff6997658c6bb5e50b969cff"  # key version 2
    rc = ResponseCache(CacheConfig())
    rc.store(rc.lookup(chat).key, "Hi! How can I help?")
    assert rc.lookup(completion).layer is None


def test_a_ttl_under_a_millisecond_still_elects_a_refresher(redis_server) -> None:  # type: ignore[no-untyped-def]
    """ttl_qa_s 0.0004: the refresh claim's hold (min(30 s, TTL)) became PX 0, which Redis refuses ("invalid expire
    time"), so every caller got the stale answer and none was told to recompute it for the whole grace period."""
    import time

    rc = ResponseCache(CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, ttl_qa_s=0.0004,
                                   namespace="r4-ttl"))
    try:
        req = _req("a short-lived question")
        t = time.time()
        rc.store(rc.lookup(req).key, "old", now=t)
        assert rc.l2 is not None and rc.l2.flush() == 1
        rc.l1.clear()
        first = rc.lookup(req, now=t + 0.001)
        assert (first.layer, first.stale, first.refresh) == ("l2", True, True)  # the claim (1 ms) went through
    finally:
        rc.close()


def test_l3_add_batch_normalises_rows_too() -> None:
    """The bulk path (index rebuilds, benchmarks) took its vectors as given: a row of length 5 matched any query."""
    pytest.importorskip("faiss", reason="L3 needs faiss-cpu")
    import time

    from trtforge.scheduler.cache.entry import Entry
    from trtforge.scheduler.cache.l3 import L3

    embed = ngram_embedding(256)
    l3 = L3(CacheConfig(layers=("l1", "l3"), l3_threshold=0.9), embed)
    now = time.time()
    entry = Entry("d1", "answer", now, now + 60, "v", scope="s", text="the capital city of France")
    l3.add_batch([entry], 5.0 * embed(entry.text).reshape(1, -1))
    assert l3.search("s", "how do I bake sourdough bread", "v", now) is None
    found = l3.search("s", "the capital city of France", "v", now)
    assert found is not None and abs(found[1] - 1.0) < 1e-5
