"""L3's number guard on held-out near-duplicates: a sign ("-20" against "20"), a comparison ("> 100" against
"< 100"), an arithmetic operator between numbers ("7 + 3" against "7 - 3"), ordinals past twelfth ("thirteenth",
"fortieth", "millionth") and Roman numerals ("World War I" against "II") are numbers too. Each pair is at least as
similar as the default threshold (0.9) by the n-gram embedding, so only the guard tells them apart."""

from __future__ import annotations

import numpy as np
import pytest

from trtforge.scheduler.cache.entry import CacheConfig
from trtforge.scheduler.cache.front import ResponseCache
from trtforge.scheduler.cache.keys import normalize_text
from trtforge.scheduler.cache.l3 import ngram_embedding
from trtforge_testing import seeded_rng

pytest.importorskip("faiss", reason="L3 needs faiss-cpu")

_TAIL = " and explain every step of the reasoning in plain words for a new colleague on the team"


def _req(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0}


def _pairs() -> list[tuple[str, str, str]]:
    """(text, near-duplicate asking something else, a typo of text that asks the same), numbers drawn at random."""
    rng = seeded_rng("test_l3_numbers_r7")
    deg, amount, a, b = (int(x) for x in rng.integers(2, 90, size=4))
    ordinal = str(rng.choice(["thirteenth", "fifteenth", "seventeenth", "nineteenth"]))
    tens = str(rng.choice(["thirtieth", "fortieth", "fiftieth", "sixtieth"]))
    return [
        (f"Set the freezer temperature to -{deg} degrees Celsius{_TAIL}",
         f"Set the freezer temperature to {deg} degrees Celsius{_TAIL}", "freezer"),
        (f"Set the freezer temperature to \u2212{deg} degrees Celsius{_TAIL}",
         f"Set the freezer temperature to +{deg} degrees Celsius{_TAIL}", "freezer"),
        (f"List all orders with a total > {amount}00 dollars{_TAIL}",
         f"List all orders with a total < {amount}00 dollars{_TAIL}", "orders"),
        (f"Compute {a} + {b} by hand{_TAIL}", f"Compute {a} - {b} by hand{_TAIL}", "Compute"),
        (f"Compute {a} * {b} by hand{_TAIL}", f"Compute {a} / {b} by hand{_TAIL}", "Compute"),
        (f"What happened in Paris on the {ordinal} of May{_TAIL}",
         f"What happened in Paris on the fourteenth of May{_TAIL}", "Paris"),
        (f"Who won the {tens} edition of the games{_TAIL}", f"Who won the seventieth edition of the games{_TAIL}",
         "edition"),
        (f"What is the millionth prime number{_TAIL}", f"What is the billionth prime number{_TAIL}", "prime"),
        (f"Who won World War I and why{_TAIL}", f"Who won World War II and why{_TAIL}", "World"),
        (f"Summarize the reign of Henry VII of England{_TAIL}", f"Summarize the reign of Henry VIII of England{_TAIL}",
         "reign"),
    ]


def _typo(text: str, word: str) -> str:
    return text.replace(word, word[:2] + word[3:], 1)


@pytest.mark.parametrize("n", range(10))
def test_near_duplicate_with_another_sign_comparison_operator_ordinal_or_roman_numeral_is_never_served(n: int) -> None:
    text, other, word = _pairs()[n]
    embed = ngram_embedding(256)
    sim = float(np.dot(embed(normalize_text(text)), embed(normalize_text(other))))
    assert sim >= 0.9, (sim, other)  # the embedding alone would serve it
    cache = ResponseCache(CacheConfig(layers=("l1", "l3")), engine_sha="e")
    cache.store(cache.lookup(_req(text)).key, "answer")
    got = cache.lookup(_req(other))
    assert not got.hit, (got.layer, other)
    same = _typo(text, word)  # the same numbers: still a near-duplicate
    assert cache.lookup(_req(same)).value == "answer", same


def test_words_that_are_not_numbers_leave_near_duplicates_served() -> None:
    """The pronoun I, hyphenated words and an acronym that is no Roman numeral do not turn typos into misses."""
    cache = ResponseCache(CacheConfig(layers=("l1", "l3")), engine_sha="e")
    text = f"Can I renew a well-known LLM licence online{_TAIL}"
    cache.store(cache.lookup(_req(text)).key, "answer")
    assert cache.lookup(_req(_typo(text, "renew"))).value == "answer"
