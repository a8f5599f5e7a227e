"""The L3 guard: which near-duplicates may share an answer (``same_question``).

An n-gram embedding finds texts that look alike; this decides whether they ask the same: the same numbers (digit
runs with their sign, number words, Roman numerals, the symbols comparing or combining numbers), the same negations
(words and contractions), no word negated by an affix on one side only, and the same guarded words (opposites and
units), each in order. See ``l3``'s module docstring for what it catches and what it cannot (a proper noun one letter
away).
"""

from __future__ import annotations

import re

# A number (a sign kept when no letter or digit precedes it: "-20 degrees" is another temperature than "20 degrees"),
# a symbol comparing or combining numbers ("total > 100" against "total < 100", "7 + 3" against "7 - 3"), or a word.
_NUMBER_OR_WORD = re.compile(r"(?:(?<!\w)[-+\u2212])?\d+(?:[.,:/-]\d+)*"
                             r"|[<>=\u2260\u2264\u2265]+|(?<=\d)\s*[-+*/^%\u00d7\u00f7\u2212](?=\s*[-+\u2212]?\d)"
                             r"|(?<=\d)\s*%|[^\W\d_]+")
#: English number words (cardinals, ordinals, multiples), compared like digit runs: "two spiders" and "three
#: spiders" are near-duplicates to n-grams (0.93) and another question.
NUMBER_WORDS = frozenset({
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty", "thirty", "forty",
    "fifty", "sixty", "seventy", "eighty", "ninety", "hundred", "thousand", "million", "billion", "trillion",
    "zeroth", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
    "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth", "eighteenth",
    "nineteenth", "twentieth", "thirtieth", "fortieth", "fiftieth", "sixtieth", "seventieth", "eightieth",
    "ninetieth", "hundredth", "thousandth", "millionth", "billionth", "trillionth", "once", "twice", "thrice", "half",
    "halves", "quarter", "quarters", "dozen", "dozens", "single", "double", "triple", "quadruple", "quintuple"
})
# Roman numerals of two letters or more, upper case as written ("World War I" / "World War II", "Henry VIII"): the
# pronoun "I" alone is not one.
_ROMAN = re.compile(r"(?=[MDCLXVI]{2})M{0,4}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})")


def _number_token(token: str) -> str | None:
    """``token`` (a match of ``_NUMBER_OR_WORD``) as the guard compares it, None when it is no number."""
    if token[0].isdigit() or token[0] in "-+\u2212" and token[1:2].isdigit():
        return token.replace("\u2212", "-")
    if not token[0].isalpha():  # an operator or comparison (blank around it does not count)
        return token.strip().replace("\u2212", "-")
    if _ROMAN.fullmatch(token):
        return token
    low = token.lower()
    return low if low in NUMBER_WORDS else None


def _numbers(text: str) -> list[str]:
    """The numbers of a text, in order: digit runs with their sign, number words (``NUMBER_WORDS``, lower-cased),
    Roman numerals, and the symbols that compare or combine numbers. A near-duplicate that differs in one (an id, an
    amount, a date, a count, a sign, ``>`` for ``<``) asks something else (n-gram similarity of "orders over $100"
    and "... $1000" is 0.98), so it is never served; "2" and "two" count as different (a miss, never a wrong
    answer)."""
    found = (_number_token(t) for t in _NUMBER_OR_WORD.findall(text))
    return [t for t in found if t is not None]


_WORD = re.compile(r"[^\W\d_]+(?:['\u2019][^\W\d_]+)?")
_NEGATIONS = frozenset({"not", "no", "never", "none", "nor", "neither", "without", "cannot", "nobody", "nothing",
                        "nowhere", "except", "excluding", "nope", "non"})


def _negations(text: str) -> list[str]:
    """The negation words of a text, in order, contractions as ``not`` ("can't", "don\u2019t"): a near-duplicate that
    adds or drops one asks the opposite question, so it is never served."""
    out = []
    for word in _WORD.findall(text.lower()):
        if word in _NEGATIONS:
            out.append(word)
        elif word.endswith(("n't", "n\u2019t")):
            out.append("not")
    return out


#: Words one near-duplicate swaps for another to ask the opposite or another amount: opposites of direction, size
#: and order, and units (a dose of 10 mg or 10 g; Celsius to Fahrenheit or back). Compared like numbers: the same
#: ones, in the same order.
GUARDED_WORDS = frozenset({
    "max", "maximum", "min", "minimum", "plus", "minus", "ascending", "descending", "increase", "decrease",
    "increasing", "decreasing", "above", "below", "over", "under", "more", "less", "fewer", "most", "least", "higher",
    "lower", "highest", "lowest", "larger", "smaller", "largest", "smallest", "bigger", "biggest", "greater",
    "greatest", "longer", "shorter", "longest", "shortest", "faster", "slower", "before", "after", "earlier", "later",
    "first", "last", "true", "false", "yes", "left", "right", "up", "down", "upper", "inside", "outside", "in", "out",
    "on", "off", "open", "close", "closed", "enable", "disable", "enabled", "disabled", "allow", "deny", "allowed",
    "denied", "accept", "reject", "include", "exclude", "add", "remove", "import", "export", "upload", "download",
    "input", "output", "buy", "sell", "win", "lose", "start", "stop", "encrypt", "decrypt", "encode", "decode",
    "north", "south", "east", "west", "from", "to", "into", "between", "and", "or", "same", "different",
    "mg", "g", "kg", "mcg", "ug", "µg", "ml", "l", "mm", "cm", "m", "km", "ft", "mi", "lb", "lbs", "oz",
    "celsius", "fahrenheit", "kelvin", "c", "f", "k", "ms", "s", "sec", "h", "hr", "second",
    "minute", "hour", "day", "week", "month", "year", "b",  # plurals fold onto these (_guard_form)
    "kb", "mb", "gb", "tb", "kib", "mib", "gib", "tib", "bit", "byte", "usd", "eur", "gbp",
    "dollars", "euros", "pounds", "percent",
})
#: Prefixes (and suffix pairs) that negate a word: "safe" / "unsafe", "legal" / "illegal", "edible" / "inedible".
_NEGATING_PREFIXES = ("un", "in", "im", "il", "ir", "non", "dis", "a", "anti", "mis", "de")
_SUFFIX_PAIRS = (("less", "ful"), ("less", ""))


def _guard_form(word: str) -> str | None:
    """``word`` (lower-case) as the guard compares it: a guarded word without a possessive or plural s ("month's",
    "months" and "month" alike: a dropped apostrophe is a typo), None when it is not guarded."""
    w = word.removesuffix("'s").removesuffix("\u2019s")
    if len(w) > 3 and w.endswith("s") and w[:-1] in GUARDED_WORDS:
        w = w[:-1]
    return w if w in GUARDED_WORDS else None


def _guarded(text: str) -> list[str]:
    """The ``GUARDED_WORDS`` of a text (``_guard_form``), in order."""
    return [g for g in map(_guard_form, _WORD.findall(text.lower())) if g is not None]


def _affix_negated(a: str, b: str) -> bool:
    """Whether one word is the other negated by a prefix or a -less / -ful suffix ("safe" / "unsafe")."""
    for x, y in ((a, b), (b, a)):
        if len(y) >= 3 and any(x == p + y or x == p + "-" + y for p in _NEGATING_PREFIXES):
            return True
        for neg, pos in _SUFFIX_PAIRS:
            stem = x[: -len(neg)]
            if x.endswith(neg) and len(stem) >= 3 and (y == stem + pos or (pos == "" and y == stem)):
                return True
    return False


def _negated_words(candidate: str, query: str) -> bool:
    """Whether a word of one text is a word of the other negated by an affix (a word both hold does not count)."""
    a, b = set(_WORD.findall(candidate.lower())), set(_WORD.findall(query.lower()))
    only_a, only_b = a - b, b - a
    return any(_affix_negated(x, y) for x in only_a for y in only_b)


def same_question(candidate: str, query: str) -> bool:
    """Near-duplicates that may share an answer: the same numbers, negations (words and affixes) and guarded words
    (``GUARDED_WORDS``: opposites and units), in order."""
    return (_numbers(candidate) == _numbers(query) and _negations(candidate) == _negations(query)
            and _guarded(candidate) == _guarded(query) and not _negated_words(candidate, query))
