"""Held-out QA of the response cache: keys separate what changes the answer (earlier turns without a conversation id,
an assistant prefill, penalties and other generation settings); an L3 similarity hit never crosses a different
system prompt, history or generation setting; an answer computed while a new engine was deployed is stored nowhere."""

from __future__ import annotations

import random
import time

import pytest

from trtforge.scheduler.cache.entry import CacheConfig
from trtforge.scheduler.cache.front import ResponseCache
from trtforge.scheduler.cache.keys import make_key


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa"]) + str(rng.randrange(99))
                    for _ in range(n))


def _chat(system: str, turns: list[tuple[str, str]], **extra: object) -> dict:
    msgs = [{"role": "system", "content": system}] + [{"role": r, "content": c} for r, c in turns]
    return {"model": "m", "temperature": 0, "messages": msgs, **extra}


def test_keys_separate_history_prefill_and_generation_settings() -> None:
    rng = random.Random(20261202)
    for _ in range(50):
        system, q1, q2, final = (_words(rng, 4) for _ in range(4))
        a = _chat(system, [("user", q1), ("assistant", "x"), ("user", final)])
        b = _chat(system, [("user", q2), ("assistant", "x"), ("user", final)])
        assert make_key(a).digest != make_key(b).digest  # no conversation id: the history is the context
        # with a conversation id too (an edited earlier turn under the same id was served the old answer)
        assert make_key(a | {"conversation_id": "c"}).digest != make_key(b | {"conversation_id": "c"}).digest
        prefill = _chat(system, [("user", final), ("assistant", q1)])
        assert make_key(prefill).digest != make_key(_chat(system, [("user", final)])).digest
        plain = make_key(_chat(system, [("user", final)])).digest
        for name, value in [("frequency_penalty", 1.5), ("presence_penalty", 0.5), ("repetition_penalty", 1.2),
                            ("min_p", 0.1), ("logit_bias", {"42": -100}), ("n", 3), ("logprobs", True),
                            ("max_completion_tokens", 7)]:
            assert make_key(_chat(system, [("user", final)], **{name: value})).digest != plain, name


@pytest.fixture()
def l3_cache() -> ResponseCache:
    pytest.importorskip("faiss")
    return ResponseCache(CacheConfig(layers=("l1", "l3")), metrics=False)


def test_l3_never_crosses_system_history_or_settings(l3_cache: ResponseCache) -> None:
    rng = random.Random(1602)
    for _ in range(20):
        system, question, earlier = _words(rng, 5), _words(rng, 8), _words(rng, 5)
        base = _chat(system, [("user", question)])
        l3_cache.store(l3_cache.lookup(base).key, "answer")
        typo = _chat(system, [("user", question + " ?")])
        assert l3_cache.lookup(typo).layer == "l3"  # a near-duplicate in the same context is still served
        for other in (_chat(_words(rng, 5), [("user", question)]),
                      _chat(system, [("user", earlier), ("assistant", "ok"), ("user", question)]),
                      base | {"max_tokens": 1}, base | {"stop": ["."]}, base | {"presence_penalty": 2.0},
                      base | {"tools": [{"type": "function", "function": {"name": "f"}}]}):
            assert not l3_cache.lookup(other).hit, other


def test_answer_computed_across_a_deploy_is_not_stored(l3_cache: ResponseCache) -> None:
    rng = random.Random(77)
    request = _chat(_words(rng, 3), [("user", _words(rng, 6))])

    def compute_while_deploying(_req: object) -> str:
        l3_cache.set_engine("a-new-manifest-sha256")  # the deploy lands while the old engine answers
        return "the old engine's answer"

    value, got = l3_cache.serve(request, compute_while_deploying)
    assert value == "the old engine's answer" and not got.hit
    assert not l3_cache.lookup(request).hit  # neither L1 nor L3 serves it under the new version
    assert len(l3_cache.l1) == 0 and len(l3_cache.l3 or []) == 0  # type: ignore[arg-type]
    value, got = l3_cache.serve(request, lambda _r: "the new engine's answer")
    assert l3_cache.lookup(request).value == "the new engine's answer"


def test_answer_computed_across_a_deploy_is_not_stored_in_redis(redis_server) -> None:  # type: ignore[no-untyped-def]
    cfg = CacheConfig(layers=("l1", "l2"), redis_url=redis_server.url, namespace=f"t:qa{time.time_ns()}")
    a, b = ResponseCache(cfg, engine_sha="old"), ResponseCache(cfg, engine_sha="old")
    try:
        request = _chat("s", [("user", _words(random.Random(5), 6))])

        def compute(_req: object) -> str:
            b.set_engine("new")  # another replica deploys the new engine meanwhile
            deadline = time.monotonic() + 5
            while a.engine_sha != "new" and time.monotonic() < deadline:
                time.sleep(0.01)
            return "old answer"

        a.serve(request, compute)
        assert a.engine_sha == "new"
        assert a.l2 is not None
        a.l2.flush()
        for replica in (a, b):
            assert not replica.lookup(request).hit
    finally:
        a.close()
        b.close()
