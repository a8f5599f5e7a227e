"""Response cache, held-out round 9.

- L3 served the answer of a near-duplicate that asks the opposite or another amount: a word negated by an affix
  (safe / unsafe, legal / illegal, edible / inedible), an opposite (maximum / minimum, five plus / minus three,
  ascending / descending), a unit (10 mg / 10 g) or the order of two units (Celsius to Fahrenheit / back).
- Keys rounded temperature and top_p to 2 decimals: a seeded request at temperature 0 (greedy) and one at 0.004
  (sampled), or 0.7 and 0.704, or top_p absent and 0.996, shared a key and so an answer.
- A stored entry whose times are the JSON strings "inf" / "nan" (float() takes them) was served and never expired.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from trtforge.scheduler.cache.entry import CacheConfig, Entry
from trtforge.scheduler.cache.keys import make_key

_TAIL = " if I ask about it today in the office?"


def _req(text: str) -> dict:
    return {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize(("text", "other"), [
    ("Is it safe to drive a car with a flat tire on the highway at night?",
     "Is it unsafe to drive a car with a flat tire on the highway at night?"),
    ("Is this mushroom edible if I find it growing in the forest near oaks?",
     "Is this mushroom inedible if I find it growing in the forest near oaks?"),
    ("Is it legal to park here on a Sunday morning in downtown Boston?",
     "Is it illegal to park here on a Sunday morning in downtown Boston?"),
    ("Is this chemical harmful to pets living in a small apartment?",
     "Is this chemical harmless to pets living in a small apartment?"),
    ("Should I take 10 mg of the medicine every morning before breakfast?",
     "Should I take 10 g of the medicine every morning before breakfast?"),
    ("Compute five plus three and explain the arithmetic in simple words",
     "Compute five minus three and explain the arithmetic in simple words"),
    ("What is the maximum dose of ibuprofen for an adult per day?",
     "What is the minimum dose of ibuprofen for an adult per day?"),
    ("Sort the list of customer names in ascending order by last name",
     "Sort the list of customer names in descending order by last name"),
    ("How do I convert Celsius to Fahrenheit in a spreadsheet formula?",
     "How do I convert Fahrenheit to Celsius in a spreadsheet formula?"),
])
def test_l3_never_serves_an_opposite_or_another_unit(text: str, other: str) -> None:
    pytest.importorskip("faiss", reason="L3 needs faiss-cpu")
    from trtforge.scheduler.cache.front import ResponseCache

    cache = ResponseCache(CacheConfig(layers=("l1", "l3")), engine_sha="e")
    cache.store(cache.lookup(_req(text)).key, "answer")
    got = cache.lookup(_req(other))
    assert not got.hit, (got.layer, other)
    typo = text.replace("the", "teh", 1) if "the" in text else text.replace("a ", "a  a ", 1)
    assert cache.lookup(_req(typo)).value == "answer", typo  # a typo of the same question is still served


def test_l3_still_serves_a_dropped_apostrophe() -> None:
    pytest.importorskip("faiss", reason="L3 needs faiss-cpu")
    from trtforge.scheduler.cache.front import ResponseCache

    cache = ResponseCache(CacheConfig(layers=("l1", "l3"), l3_threshold=0.8), engine_sha="e")
    cache.store(cache.lookup(_req("Where do I download last month's invoice?")).key, "billing page")
    assert cache.lookup(_req("Where do I download last months invoice?")).layer == "l3"


@pytest.mark.parametrize(("a", "b"), [({"temperature": 0}, {"temperature": 0.004}),
                                      ({"temperature": 0.7}, {"temperature": 0.704}),
                                      ({}, {"top_p": 0.996}), ({"top_p": 0.9}, {"top_p": 0.9001})])
def test_seeded_requests_with_other_sampling_never_share_a_key(a: dict, b: dict) -> None:
    base = {"model": "m", "seed": 7, "messages": [{"role": "user", "content": "Write a haiku"}]}
    ka, kb = make_key({**base, **a}), make_key({**base, **b})
    assert ka.cacheable and kb.cacheable
    assert ka.digest != kb.digest
    assert make_key({**base, "temperature": -0.0}).digest == make_key({**base, "temperature": 0}).digest


@pytest.mark.parametrize(("field", "value"), [("e", "inf"), ("c", "nan"), ("e", "Infinity"), ("e", True),
                                              ("c", None)])
def test_an_entry_whose_times_are_not_finite_numbers_is_refused(field: str, value: object) -> None:
    raw = Entry(digest="d", value="forged", created=1.0, expires=2.0, version="v").to_bytes()
    body = json.loads(raw.partition(b"|")[2])
    body[field] = value
    data = json.dumps(body).encode()
    forged = hashlib.sha256(data).hexdigest()[:16].encode() + b"|" + data  # a valid checksum (it is not keyed)
    with pytest.raises(ValueError, match="finite number"):
        Entry.from_bytes(forged, "d")
