"""Cache keys on held-out request fields (QA): every field but the transport ones changes the key (``tool_choice``,
``stop_token_ids``, ``ignore_eos``, ``reasoning_effort``, ``guided_json``... shared one answer); a message's other
fields (``name``, ``tool_calls``) and non-string contents (parts, null beside tool_calls) are keyed (two tool calls
with other arguments and the same result shared an answer; null or a list of parts raised out of ``serve``);
``adapter: null`` beside ``lora`` is that LoRA (it was the base model's key)."""

from __future__ import annotations

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.scheduler.cache.entry import CacheConfig
from trtforge.scheduler.cache.front import ResponseCache
from trtforge.scheduler.cache.keys import TRANSPORT, make_key

BASE = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "What's the weather in Paris?"}],
        "temperature": 0, "tools": [{"type": "function", "function": {"name": "get_weather"}}]}
CHANGES_ANSWER = [("tool_choice", "none"), ("tool_choice", "required"), ("parallel_tool_calls", False),
                  ("stop_token_ids", [2]), ("ignore_eos", True), ("suffix", "!"), ("echo", True),
                  ("reasoning_effort", "high"), ("guided_json", {"type": "object"}), ("guided_choice", ["a", "b"]),
                  ("chat_template_kwargs", {"enable_thinking": False}), ("typical_p", 0.5),
                  ("include_stop_str_in_output", True), ("a_field_nobody_knows", 1)]


def _tool_turns(city: str, content: object = "") -> dict:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}
    return BASE | {"messages": [*BASE["messages"], {"role": "assistant", "content": content, "tool_calls": [call]},
                                {"role": "tool", "tool_call_id": "c1", "content": "21 C"}]}


@pytest.mark.parametrize(("name", "value"), CHANGES_ANSWER)
def test_every_non_transport_field_is_keyed(name: str, value: object) -> None:
    plain = make_key(BASE)
    other = make_key(BASE | {name: value})
    assert other.digest != plain.digest and other.scope != plain.scope  # neither L1/L2 nor an L3 hit crosses it
    assert make_key(BASE | {name: value}) == other


def test_transport_fields_do_not_change_the_key() -> None:
    plain = make_key(BASE).digest
    assert make_key(BASE | dict.fromkeys(TRANSPORT, "x")).digest == plain
    assert make_key(BASE | {"stream": True, "user": "alice", "id": "r1", "metadata": {"t": 1}}).digest == plain


def test_message_fields_and_contents_are_keyed() -> None:
    assert make_key(_tool_turns("Paris")).digest != make_key(_tool_turns("London")).digest
    assert make_key(_tool_turns("Paris", None)).digest != make_key(_tool_turns("London", None)).digest
    named = [make_key(BASE | {"messages": [{"role": "user", "content": "hi", "name": n}]}) for n in ("ann", "bob")]
    assert named[0].digest != named[1].digest and named[0].scope != named[1].scope
    parts = [make_key(BASE | {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": u}}]}]}) for u in "ab"]
    assert parts[0].digest != parts[1].digest and parts[0].scope != parts[1].scope
    for bad in ({"role": "user"}, {"role": "user", "content": 5}):
        with pytest.raises(InputError, match=r"messages\[0\]"):
            make_key(BASE | {"messages": [bad]})
    assert make_key(BASE).digest == make_key(BASE | {"messages": [dict(m) for m in BASE["messages"]]}).digest


def test_adapter_null_beside_lora_is_that_lora() -> None:
    assert make_key(BASE | {"adapter": None, "lora": "sql"}).digest == make_key(BASE | {"lora": "sql"}).digest
    assert make_key(BASE | {"adapter": None, "lora": "sql"}).digest != make_key(BASE).digest
    assert make_key(BASE | {"adapter": "sql", "lora": "sql"}).digest == make_key(BASE | {"adapter": "sql"}).digest
    with pytest.raises(InputError, match="different adapters"):
        make_key(BASE | {"adapter": "sql", "lora": "chat"})


def test_cache_serves_each_tool_call_its_own_answer() -> None:
    cache = ResponseCache(CacheConfig(), metrics=False)
    for city in ("Paris", "London"):
        answer = f"It is 21 C in {city}."
        assert cache.serve(_tool_turns(city, None), lambda _r, a=answer: a)[0] == answer
    assert cache.serve(BASE | {"tool_choice": "none"}, lambda _r: "no tools")[0] == "no tools"
    assert cache.serve(BASE, lambda _r: "called get_weather")[0] == "called get_weather"


def test_prompt_over_the_size_limit_is_served_not_refused() -> None:
    """Over MAX_TEXT characters a request is not cached; it was an InputError, so ``serve`` failed it."""
    from trtforge.scheduler.cache.keys import MAX_TEXT

    cache = ResponseCache(CacheConfig())
    big = {"model": "m", "prompt": "word " * (MAX_TEXT // 5 + 1), "temperature": 0}
    assert not make_key(big).cacheable and make_key({**big, "prompt": "word"}).cacheable
    assert [cache.serve(big, lambda _r, n=n: n)[0] for n in range(2)] == [0, 1]  # computed each time, never stored
    assert len(cache.l1) == 0
    assert cache.metrics is not None and cache.metrics.value("cache_access_total", result="uncacheable",
                                                             layer="all") == 2


@pytest.mark.parametrize("request_", [
    {"model": "m", "prompt": ["a list", "of prompts"], "temperature": 0},  # completions' list form: not keyed here
    {"model": "m", "messages": [{"content": "no role"}], "temperature": 0},
    {"model": "m", "temperature": 0},  # neither messages nor prompt: the scheduler's to refuse, not the cache's
])
def test_serve_passes_a_request_it_cannot_key_to_the_scheduler(request_: dict) -> None:
    """``lookup`` refuses these (InputError names the field); ``serve`` computes them uncached instead of failing
    the request, counts them, and never stores them (a second identical request is computed again)."""
    cache = ResponseCache(CacheConfig())
    with pytest.raises(InputError):
        cache.lookup(request_)
    calls: list[object] = []
    for expected_calls in (1, 2):
        value, got = cache.serve(request_, lambda r: calls.append(r) or f"answer {len(calls)}")
        assert value == f"answer {expected_calls}" and not got.hit and len(calls) == expected_calls
        assert calls[-1] is request_
    assert cache.metrics is not None
    assert cache.metrics.value("cache_access_total", result="uncacheable", layer="unkeyable") == 2


def test_simulated_cache_keys_the_cap_and_salt_as_the_real_one_does() -> None:
    """The simulator's front served a repeat of a prompt under another ``max_tokens`` cap (or cache_salt) from the
    cache: the real key (``max_tokens`` exact) misses there."""
    from trtforge.scheduler.request import Request
    from trtforge.scheduler.sim.response_cache import request_key

    def req(cap: int, salt: str | None = None) -> Request:
        return Request("r", 0.0, 1000, cap, block_hashes=(1, 2), cache_salt=salt)

    assert request_key(req(20)) == request_key(req(20))
    assert request_key(req(20)) != request_key(req(21))
    assert request_key(req(20)) != request_key(req(20, "tenant-b"))
    assert make_key(BASE | {"max_tokens": 20}).digest != make_key(BASE | {"max_tokens": 21}).digest
    assert make_key(BASE | {"cache_salt": "a"}).digest != make_key(BASE | {"cache_salt": "b"}).digest


@pytest.mark.parametrize("bad", [{"l1_entries": 0}, {"l1_entries": -1}, {"buffer_max": 0}, {"flush_entries": 0},
                                 {"l3_dim": 0}, {"stale_grace_s": -1.0},
                                 {"layers": ("l1", "l2"), "redis_url": "localhost:6379"}])
def test_config_refuses_counts_below_one_naming_the_field(bad: dict) -> None:
    """l1_entries=0 made every store raise cachetools' "value too large" after the answer was computed, buffer_max=0
    an IndexError, l3_dim=0 a ZeroDivisionError, a URL without scheme redis-py's ValueError."""
    name = next(iter(bad)) if "redis_url" not in bad else "redis url"
    with pytest.raises(InputError, match=name):
        CacheConfig(**bad)  # type: ignore[arg-type]


def test_developer_messages_are_keyed_like_system_ones() -> None:
    """A "developer" message (the system role of newer OpenAI models) was an earlier turn, not read under a
    conversation_id: two requests with other developer instructions shared an answer."""
    def req(instructions: str) -> dict:
        return {"model": "m", "temperature": 0, "conversation_id": "c1",
                "messages": [{"role": "developer", "content": instructions}, {"role": "user", "content": "Hi"}]}

    assert make_key(req("Answer in French.")).digest != make_key(req("Answer in Klingon.")).digest
    assert make_key(req("Answer in French.")).scope != make_key(req("Answer in Klingon.")).scope


@pytest.mark.parametrize("temperature, seed, cacheable", [
    (0, None, True), (0.0, None, True), (-0.0, None, True),
    (0.004, None, False),  # keyed as 0.0 (2 decimals) but it samples: was judged greedy and cached
    (1e-9, None, False), (0.004, 7, True),
])
def test_greedy_reads_the_temperature_as_sent(temperature: float, seed: int | None, cacheable: bool) -> None:
    req: dict = {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": temperature}
    if seed is not None:
        req["seed"] = seed
    assert make_key(req).cacheable is cacheable
