"""L3 on held-out inputs (QA): an embedding of the wrong size is an InputError naming l3_dim (it was a bare FAISS
AssertionError out of ``store``); the HNSW index prunes (``remove_ids`` is not implemented there: ``set_engine``
raised RuntimeError); "similarity at least the threshold" holds in float32 (an identical text missed at threshold
1.0 in 43 of 200 cases); an answer re-stored after expiry replaces its expired copies (they piled up, were never
removed and hid the live entry behind k=4 dead ones) and expired entries leave the index (it grew forever)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.scheduler.cache.entry import CacheConfig
from trtforge.scheduler.cache.front import ResponseCache
from trtforge.scheduler.cache.l3 import ngram_embedding

pytest.importorskip("faiss", reason="L3 needs faiss-cpu")


def _req(text: str, **kw: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0, **kw}


def _cache(**cfg: object) -> ResponseCache:
    embed = cfg.pop("embed", None)
    return ResponseCache(CacheConfig(layers=("l1", "l3"), **cfg), engine_sha="e", embed=embed)  # type: ignore[arg-type]


def test_embedding_of_the_wrong_size_is_an_input_error() -> None:
    with pytest.raises(InputError, match="l3_dim is 64"):
        _cache(l3_dim=64, embed=ngram_embedding(32))
    short = ngram_embedding(16)

    def varies(text: str) -> np.ndarray:  # right size for short texts only
        return np.zeros(8, dtype=np.float32) if len(text) > 40 else short(text)

    cache = _cache(l3_dim=16, embed=varies)
    cache.store(cache.lookup(_req("short question")).key, "ok")
    with pytest.raises(InputError, match="l3_dim"):
        cache.store(cache.lookup(_req("a question that is much longer than forty characters")).key, "x")


def test_hnsw_index_prunes_and_keeps_serving() -> None:
    cache = _cache(l3_index="hnsw", l3_threshold=0.8)
    text = "How do I reset my password on the billing portal?"
    cache.store(cache.lookup(_req(text)).key, "old engine")
    cache.set_engine("new-manifest")  # prunes the old version's entries
    assert len(cache.l3) == 0 and not cache.lookup(_req(text)).hit  # type: ignore[arg-type]
    for i in range(20):
        cache.store(cache.lookup(_req(f"{text} variant {i}")).key, i, now=1000.0 if i % 2 else None)
    assert cache.l3 is not None and cache.l3.prune(cache.version) == 10  # the expired half, rebuilt without them
    cache.l1.clear()
    got = cache.lookup(_req(f"{text} variant 4"))
    assert (got.layer, got.value) == ("l3", 4)


def test_threshold_is_at_least_in_float32() -> None:
    # labels without digits or number words (the number guard would refuse those before the threshold is asked)
    cosine = {"base": 1.0, "alpha": 0.70, "beta": 0.69, "gamma": 0.90, "delta": 0.89}

    def axis(text: str) -> np.ndarray:  # a word's vector has exactly its cosine against "base"
        c = cosine.get(text, 0.0)
        return np.array([c, math.sqrt(1 - c * c)], dtype=np.float32)

    for threshold, probe, hit in [(0.7, "alpha", True), (0.7, "beta", False), (1.0, "base", True),
                                  (0.9, "gamma", True), (0.9, "delta", False)]:
        cache = _cache(l3_dim=2, l3_threshold=threshold, embed=axis)
        cache.store(cache.lookup(_req("base")).key, "a")
        cache.l1.clear()
        assert cache.lookup(_req(probe)).hit is hit, (threshold, probe)
    cache = _cache(l3_threshold=1.0)
    rng = random.Random(1602)
    for i in range(200):
        text = " ".join(rng.choice(["refund", "order", "invoice", "policy", "late", "why"]) for _ in range(8)) + str(i)
        cache.store(cache.lookup(_req(text)).key, i)
        cache.l1.clear()
        assert cache.lookup(_req(text)).value == i  # the identical text's own similarity reaches 1.0


def test_restored_answer_replaces_expired_copies_and_expired_entries_leave() -> None:
    cache = _cache(l3_threshold=0.8, ttl_qa_s=100.0)
    text = "How do I reset my password on the billing portal?"
    now = 1000.0
    for n in range(6):  # asked again after each expiry: recomputed and stored again
        got = cache.lookup(_req(text), now=now)
        assert not got.hit
        cache.store(got.key, f"answer {n}", now=now)
        cache.l1.clear()
        now += 150.0
    cache.store(cache.lookup(_req(text), now=now).key, "fresh", now=now)
    assert len(cache.l3) == 1  # type: ignore[arg-type]
    near = cache.lookup(_req(text.replace("password", "pasword")), now=now + 1)
    assert (near.layer, near.value) == ("l3", "fresh")
    for i in range(3000):  # long-expired unique questions: swept out as entries are added
        cache.store(cache.lookup(_req(f"question {i}"), now=1000.0).key, i, now=1000.0)
    assert len(cache.l3) <= 1024  # type: ignore[arg-type]
    assert cache.metrics is not None and cache.metrics.value("cache_eviction_total", layer="l3") >= 2000
    assert cache.l3 is not None and set(cache.l3._ids.values()) == set(cache.l3._entries)  # one id per digest
    cache.rebuild_index()
    assert len(cache.l3) == 0 and not cache.l3._ids and not cache.l3._index



def test_near_duplicate_with_other_numbers_is_never_served() -> None:
    """n-gram similarity of texts differing only in a number is high (customer 1043/1044: 0.95, $100/$1000: 0.98):
    at the default threshold (0.9) L3 served the other customer's or amount's answer."""
    cache = _cache()
    for text, answer in [("Summarize the contract for customer 1043 and list the termination clauses.", "c1043"),
                         ("What is the refund policy for orders over $100?", "100")]:
        cache.store(cache.lookup(_req(text)).key, answer)
        other = text.replace("1043", "1044").replace("$100", "$1000")
        assert not cache.lookup(_req(other)).hit, other
        typo = text.replace("contract", "contarct").replace("policy", "polcy")
        assert cache.lookup(_req(typo)).value == answer  # same numbers: still a near-duplicate


@pytest.mark.parametrize(("text", "other"), [
    ("Which cocktails can I make with alcohol at home?", "Which cocktails can I make without alcohol at home?"),
    ("Is it safe to take ibuprofen with this medication?", "Is it not safe to take ibuprofen with this medication?"),
    ("Why can I log in to my account from the app?", "Why can't I log in to my account from the app?"),
    ("List the hotels in Paris that allow pets and have parking.",
     "List the hotels in Paris that allow no pets and have parking."),
])
def test_near_duplicate_with_other_negations_is_never_served(text: str, other: str) -> None:
    """n-gram similarity of a question and its negation is ~0.9 ("with"/"without alcohol": 0.91): at the default
    threshold L3 served the opposite question's answer. A typo that keeps the negations is still served."""
    cache = _cache()
    cache.store(cache.lookup(_req(text)).key, "answer")
    assert not cache.lookup(_req(other)).hit, other
    cache.store(cache.lookup(_req(other)).key, "negated")
    typo = other.replace("at home", "at hom").replace("ibuprofen", "ibuprofn").replace("account", "acount") \
        .replace("parking", "parkng")
    assert cache.lookup(_req(typo)).value == "negated", typo


def _saved(tmp_path: Path) -> dict:
    cache = _cache(l3_threshold=0.8)
    for i in range(3):
        cache.store(cache.lookup(_req(f"How many vacation days do hires of team {i} get?")).key, f"v{i}")
    cache.store(cache.lookup(_req("the chart as png")).key, b"\x89PNG")
    cache.l3.save(tmp_path)  # type: ignore[union-attr]
    return json.loads((tmp_path / "l3.json").read_text())


def _edit(data: dict, **entry0: object) -> str:
    return json.dumps({**data, "entries": [{**data["entries"][0], **entry0}, *data["entries"][1:]]})


def test_l3_json_that_save_does_not_write_is_an_input_error_and_loads_nothing(tmp_path: Path) -> None:
    """A truncated or corrupt l3.json raised JSONDecodeError/KeyError/TypeError (after loading part of it), another
    format loaded silently, an expiry edited into a string loaded and then made every lookup raise TypeError out of
    serve, and a value that is not base64 was served as b''."""
    data = _saved(tmp_path)
    good = json.dumps(data)
    binary = next(i for i, it in enumerate(data["entries"]) if it.get("b"))
    bad_b64 = {**data, "entries": [{**it, "v": "!!"} if i == binary else it for i, it in enumerate(data["entries"])]}
    cases = {"truncated": good[: len(good) // 2], "empty": "", "a list": "[1]",
             "format 2": json.dumps(data | {"format": 2}),
             "no version": json.dumps({k: v for k, v in data.items() if k != "version"}),
             "no text": json.dumps({**data, "entries": [{k: v for k, v in data["entries"][0].items() if k != "t"}]}),
             "string expiry": _edit(data, e="soon"), "nan expiry": _edit(data, e=float("nan")),
             "not base64": json.dumps(bad_b64)}
    for name, text in cases.items():
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        (folder / "l3.json").write_text(text)
        cache = _cache(l3_threshold=0.8)
        with pytest.raises(InputError, match=r"l3\.json: .*(delete it|save)") as err:
            cache.l3.load(folder)  # type: ignore[union-attr]
        assert "\n" not in str(err.value), name
        assert len(cache.l3) == 0 and cache.l3.version == 1, name  # type: ignore[union-attr,arg-type]
        assert not cache.lookup(_req("How many vacation days do hires of team 0 get ?")).hit, name
    with pytest.raises(InputError, match="no saved index"):
        _cache().l3.load(tmp_path / "nowhere")  # type: ignore[union-attr]
    other_dim = _cache(l3_dim=128, l3_threshold=0.8)  # vectors are not saved: the texts are embedded again
    other_dim.l3.load(tmp_path)  # type: ignore[union-attr]
    assert other_dim.lookup(_req("How many vacation days do hires of team 1 get?")).value == "v1"
    assert other_dim.lookup(_req("the chart as png")).value == b"\x89PNG"


@pytest.mark.parametrize(("text", "other"), [
    ("Summarize the contract terms for the two largest customers and list every termination clause they signed.",
     "Summarize the contract terms for the three largest customers and list every termination clause they signed."),
    ("Book a table for four people at the Italian restaurant downtown on Friday evening, near the window please.",
     "Book a table for five people at the Italian restaurant downtown on Friday evening, near the window please."),
    ("What was the second largest city of the Roman empire during the reign of Hadrian, and how many lived there?",
     "What was the third largest city of the Roman empire during the reign of Hadrian, and how many lived there?"),
    ("Scale this bread recipe for twenty-one guests and convert every measurement to grams and milliliters please.",
     "Scale this bread recipe for twenty-two guests and convert every measurement to grams and milliliters please."),
])
def test_near_duplicate_with_other_number_words_is_never_served(text: str, other: str) -> None:
    """Numbers written as words: the guard compared digit runs only, so at the default threshold (0.9) a request
    differing in one number word (n-gram similarity 0.94-0.96 here) was served the other count's answer. A typo
    elsewhere is still served."""
    cache = _cache()
    cache.store(cache.lookup(_req(text)).key, "answer")
    assert not cache.lookup(_req(other)).hit, other
    typo = text.replace("contract", "contarct").replace("evening", "evenng").replace("empire", "empre") \
        .replace("guests", "guets")
    assert cache.lookup(_req(typo)).value == "answer", typo
