"""The response-cache key: a documented contract from a request's semantic fields to one sha256.

A request is a chat-completions-style JSON object. The key covers, and only covers:

| field | normalisation |
|---|---|
| ``model`` | required string, stripped |
| ``adapter`` (or ``lora``) | string or absent/null (= base model); a different adapter is a different key; both
  spellings naming different adapters is an error |
| ``conversation_id`` | string or absent; different conversations never share an entry |
| ``task`` (role/task class) | string or absent (e.g. "qa", "tool"; also picks the TTL class) |
| ``messages`` | the *system* (and *developer*) messages (one placed after another turn, with how many turns
  precede it: a system message after the question is another prompt than one before it), the *final user* message
  and every turn after it (an assistant prefill), text normalised (below), roles lower-cased; and every earlier
  turn (in order), so two histories ending in the same question never share an entry, with or without a
  ``conversation_id`` (key version 1 took the id for the history: an edited earlier turn got the old answer; a
  request that sends only its final turn is keyed by the id and that turn). A message's other
  fields (``name``, ``tool_calls``, ``tool_call_id``...) and a content that is not a string (a list of parts, or null
  beside ``tool_calls``) are keyed as canonical JSON |
| ``prompt`` | instead of ``messages``: the same text normalisation; a completions request (a raw prompt, no chat
  template), so never the key of a chat request whose user message holds the same text |
| ``temperature``, ``top_p`` | exact, as float64 (``-0.0`` = ``0.0``); absent = 1.0 (rounding them to 2 decimals
  gave a seeded greedy request the key of a seeded one at 0.004, which samples) |
| ``top_k``, ``max_tokens``, ``seed`` | integers, exact; absent = null |
| ``stop`` | a string or list of strings, sorted and deduplicated |
| ``response_format``, ``tools`` | canonical JSON (sorted keys) |
| every other field but the transport ones below (``frequency_penalty``, ``presence_penalty``,
  ``repetition_penalty``, ``min_p``, ``logit_bias``, ``n``, ``best_of``, ``max_completion_tokens``, ``min_tokens``,
  ``logprobs``, ``tool_choice``, ``parallel_tool_calls``, ``stop_token_ids``, ``ignore_eos``, ``suffix``,
  ``reasoning_effort``, ``guided_*``, ``chat_template_kwargs``, any field not known here...) | canonical JSON, exact
  (present = part of the key; an explicit default is another key than absent: a miss, never a collision) |

Text normalisation: Unicode NFKC, line endings to ``\\n``, runs of spaces and tabs to one space, trailing spaces on
each line removed, runs of 3+ newlines to 2, leading/trailing blank space removed.

Only transport and debug data (``TRANSPORT``: ``id``, ``request_id``, ``user``, ``stream``, ``stream_options``,
``metadata``, ``timeout``, ``request_timeout``, ``headers``, ``extra_headers``, ``debug``, ``priority``,
``service_tier``, ``store``) does not change the key: a field this contract does not know is keyed, since it may
change the answer (an unknown field costs a miss, an ignored one could serve another request's answer). Text is not
case-folded (case changes meaning). Equal texts under these normalisations give equal keys; a different model,
adapter, conversation, task, message read above or generation setting gives a different key. What the normalisations
merge, on purpose: NFKC also maps compatibility characters to their plain forms, some of which differ in meaning
(``x²`` and ``x2``, ``①`` and ``1``, ``½`` and ``1⁄2``), and blank runs collapse inside code and quoted strings too
(indentation included): prompts differing only so share a key.

Scope (what a semantic L3 hit may not cross): model, adapter, conversation, task and a digest of every other keyed
field except the final user message (system messages, the other turns read, every generation setting): two
requests share a scope only when they differ in nothing but the final user message's text.

Cacheability: a request is reproducible, and so cacheable, when it is greedy (``temperature`` exactly 0: 0.004
samples; or ``top_k`` 1) or carries a ``seed``; a sampled request without a seed is not cached unless
the policy's ``cache_sampled`` is on. A request whose system and final user messages hold over ``MAX_TEXT`` (2**20)
characters is not cacheable either (it is answered by the scheduler, never refused).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import marshal
import re
import sys
import unicodedata
from typing import Any, NamedTuple

from trtforge.build_engine.core.errors import InputError

KEY_VERSION = 2  # 2: temperature and top_p exact (1 rounded them to 2 decimals), earlier turns always keyed
# The fields read by name (normalised as the table above says); every other field but TRANSPORT's is keyed exactly.
_SEMANTIC = {"model", "adapter", "lora", "conversation_id", "task", "messages", "prompt", "temperature", "top_p",
             "top_k", "max_tokens", "seed", "stop", "response_format", "tools"}
# How a request travels or is traced, never what it answers: the only fields that do not change the key.
TRANSPORT = frozenset({"id", "request_id", "user", "stream", "stream_options", "metadata", "timeout",
                       "request_timeout", "headers", "extra_headers", "debug", "priority", "service_tier", "store"})
MAX_TEXT = 1 << 20  # characters of prompt text a cacheable request may have (a cache is no place for bigger ones)


# A NamedTuple: immutable (the memo below shares keys) and made in 0.3 us, where a frozen dataclass takes 1.3 us
# (each field set through object.__setattr__).
class CacheKey(NamedTuple):
    digest: str  # sha256 hex of the canonical form
    scope: str  # JSON [model, adapter, conversation, task, context]: semantic (L3) hits never cross scopes
    text: str  # the normalised final user message (what L3 embeds)
    task: str | None
    cacheable: bool


# One encoder object: json.dumps with non-default options builds a new one per call (~2 us of every lookup). The same
# options as before, so the same bytes and the same keys.
# No cycle check (a request parsed from JSON has none): one dict fewer allocated per key, so fewer garbage collections
# land in a lookup.
_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), check_circular=False).encode
_ENC = json.encoder.encode_basestring  # what the encoder above uses for strings (ensure_ascii off)


_BLANKS = re.compile(r"[ \t\f\v]+")
_NEWLINES = re.compile(r"\n{3,}")


def normalize_text(text: str) -> str:
    # The fast paths skip steps that are the identity on their input (NFKC on ASCII, line rules on one line):
    # a key is computed on every lookup, inside L1's 100 us budget.
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _BLANKS.sub(" ", text)
    if "\n" in text:
        text = "\n".join(line.rstrip() for line in text.split("\n"))
        text = _NEWLINES.sub("\n\n", text)
    return text.strip()


def _string(req: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = req.get(name)
    if value is None:
        if required:
            raise InputError(f"request: field {name!r} is required (a string)")
        return None
    if not isinstance(value, str):
        raise InputError(f"request: field {name!r} must be a string, got {type(value).__name__}")
    return value.strip()


_FLOAT_MAX = sys.float_info.max


def _number(req: dict[str, Any], name: str, default: float | None, integer: bool = False) -> float | int | None:
    value = req.get(name, default)
    if value is None:
        return None
    if type(value) is int and -(1 << 53) < value < (1 << 53):  # the common case, same result as the checks below
        return value if integer else float(value) + 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or abs(value) == float("inf"):
        raise InputError(f"request: field {name!r} must be a finite number, got {value!r}")
    if isinstance(value, int):  # beyond 2**53: exact as an integer; float() of a huge one would overflow
        if integer and -(1 << 63) <= value < (1 << 63):
            return value
        if not integer and abs(value) <= _FLOAT_MAX:
            return float(value) + 0.0
        raise InputError(f"request: field {name!r} is out of range ({'a 64-bit integer' if integer else 'a float'}), "
                         f"got {str(value)[:40]}")
    if integer:
        if float(value) != int(value):
            raise InputError(f"request: field {name!r} must be an integer, got {value!r}")
        return int(value)
    return float(value) + 0.0


@functools.lru_cache(maxsize=2048)
def _normalized_short(text: str) -> str:
    return normalize_text(text)


def _normalized(text: str) -> str:
    # A hit repeats a text already seen: short ones (system prompts, questions) are remembered, so a lookup hashes
    # the text instead of normalising it again; bounded in entries and in size (1 KiB texts at most).
    return _normalized_short(text) if len(text) <= 1024 else normalize_text(text)


Turn = tuple[str, str] | tuple[str, str, dict[str, Any]]  # (role, text) or (role, text, the message's other fields)


def _turn(i: int, m: Any) -> Turn:
    """One message, normalised: a plain {role, content: str} is (role, text); any other field (``name``,
    ``tool_calls``, ``tool_call_id``...) or a content that is not a string (a list of parts; null beside
    ``tool_calls``) is kept as canonical JSON in a third element, so it separates keys."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise InputError(f"request: messages[{i}] must be an object with a string 'role' and a 'content'")
    role, content = m["role"].strip().lower(), m.get("content")
    extra = {k: v for k, v in m.items() if k not in ("role", "content")}
    if isinstance(content, str):
        return (role, _normalized(content), extra) if extra else (role, _normalized(content))
    if isinstance(content, list) or (content is None and extra):
        return role, "", {**extra, "content": content}
    raise InputError(f"request: messages[{i}] must have a string 'content' (or a list of parts, or null beside "
                     "'tool_calls')")


def _messages(req: dict[str, Any]) -> tuple[list[Turn], Turn, list[Turn], list[int]]:
    """(system messages, final user message, the other turns the key reads, how many other turns precede each
    system message), normalised: every turn before and after the final user message, in order (also with a
    ``conversation_id``: a client that edits an earlier turn under the same id was served the old answer)."""
    if "messages" not in req:
        prompt = _string(req, "prompt")
        if prompt is None:
            raise InputError("request: needs 'messages' (a list of {role, content}) or 'prompt' (a string)")
        return [], ("user", _normalized(prompt)), [], []
    msgs = req["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise InputError("request: 'messages' must be a non-empty list of {role, content} objects")
    system: list[Turn] = []
    at: list[int] = []  # non-system turns before each system message (a system message after the question differs)
    turns: list[Turn] = []  # non-system messages, in order
    last_user = -1
    for i, m in enumerate(msgs):
        turn = _turn(i, m)
        if turn[0] in ("system", "developer"):  # "developer": the system role of newer OpenAI models
            system.append(turn)
            at.append(len(turns))
            continue
        if turn[0] == "user":
            last_user = len(turns)
        turns.append(turn)
    if last_user < 0:
        raise InputError("request: 'messages' has no user message; the cache keys on the final user message")
    other = turns[:last_user] + turns[last_user + 1:]
    return system, turns[last_user], other, at


def _stop(req: dict[str, Any]) -> list[str]:
    stop = req.get("stop")
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise InputError("request: 'stop' must be a string or a list of strings")
    return sorted(set(items))


@functools.lru_cache(maxsize=4096)
def _scope(model: str | None, adapter: str | None, conversation: str | None, task: str | None, context: str) -> str:
    # Few distinct scopes, asked on every lookup: remembered rather than encoded each time (the same string).
    return json.dumps([model, adapter, conversation, task, context])


# Requests already seen: their keys, by a serialisation of their semantic fields. A hit repeats a request, and the
# key's Python steps (~20 us: validation, normalisation, canonical JSON, sha256) were most of an L1 hit's time.
# marshal (format 2: no back-references, so the bytes depend on values, not on object identity) is exact and
# type-faithful for the plain JSON values it accepts (str, int, float, bool, None, list, dict; tuples are marked
# apart) and refuses anything else, subclasses included; it can be read back, so equal bytes are equal values of
# equal types in the same order (another order is only a memo miss), and a remembered key is the key computed
# afresh (property-tested). Presence counts (absent and null differ for some fields), and so does the policy.
# Only plain dicts with a few messages and a short serialisation are remembered, so no request pays for a long
# one or leaves a big entry: 4096 entries of at most 4 KiB (with their keys, some 30 MiB at the very worst,
# ~2-3 MiB full of requests of a few hundred bytes), least recently used first out.
_MEMO: collections.OrderedDict[bytes, CacheKey] = collections.OrderedDict()
_MEMO_ENTRIES = 4096
_MEMO_BYTES = 4096
_MEMO_MESSAGES = 4


def _fingerprint(req: dict[str, Any], cache_sampled: bool) -> bytes | None:
    msgs = req.get("messages")
    if type(msgs) is list and len(msgs) > _MEMO_MESSAGES:  # long conversations: the key reads only two turns
        return None
    try:
        fp = marshal.dumps((cache_sampled, {k: v for k, v in req.items() if k not in TRANSPORT}), 2)
    except (ValueError, TypeError):  # not plain JSON values (or nested too deep): the full path decides
        return None
    return fp if len(fp) <= _MEMO_BYTES else None


def make_key(req: Any, *, cache_sampled: bool = False) -> CacheKey:
    """The key of ``req`` (a dict parsed from JSON); raises InputError naming the field at fault."""
    fp = _fingerprint(req, cache_sampled) if type(req) is dict else None
    if fp is not None:
        try:  # a hit becomes the most recently used; KeyError: not remembered (or evicted meanwhile by a thread)
            _MEMO.move_to_end(fp)
            return _MEMO[fp]
        except KeyError:
            pass
    key = _compute_key(req, cache_sampled)  # a bad request raises here, every time (errors are not remembered)
    if fp is not None:
        _MEMO[fp] = key
        if len(_MEMO) > _MEMO_ENTRIES:
            with contextlib.suppress(KeyError):  # emptied meanwhile by another thread
                _MEMO.popitem(last=False)
    return key


def _compute_key(req: Any, cache_sampled: bool) -> CacheKey:
    c = _canonical_fields(req)
    try:
        blob = _encode_canonical(c)
    except (TypeError, ValueError) as exc:
        raise InputError(f"request: 'response_format'/'tools'/sampling settings must be plain JSON ({exc})") from exc
    try:
        data = blob.encode()
    except UnicodeEncodeError as exc:  # JSON's "\ud800" escape parses to a str that is not valid Unicode
        raise InputError("request: a text holds an unpaired surrogate (a lone \\ud800-\\udfff escape); send valid "
                         "Unicode") from exc
    # greedy only at exactly 0 (0.004 samples)
    greedy = req.get("temperature", 1.0) == 0 or c["top_k"] == 1
    # Over MAX_TEXT characters: not cached (looked up nowhere, stored nowhere), but served: it was an InputError,
    # so ``serve`` failed a request the scheduler could answer.
    small = len(c["final"]) + sum(len(t[1]) for t in c["system"]) <= MAX_TEXT
    # The scope's last part: every keyed field but the final user message (system prompts, other turns, generation
    # settings), so an L3 (similarity) hit only ever crosses requests that differ in that message's text alone.
    context = hashlib.sha256(_encode_canonical({**c, "final": ""}).encode()).hexdigest()[:16]
    scope = _scope(c["model"], c["adapter"], c["conversation"], c["task"], context)
    return CacheKey(digest=hashlib.sha256(data).hexdigest(), scope=scope, text=c["final"], task=c["task"],
                    cacheable=small and (greedy or c["seed"] is not None or cache_sampled))


def _canonical_fields(req: Any) -> dict[str, Any]:
    """The key's fields, validated and normalised (the dict whose canonical JSON is hashed)."""
    if not isinstance(req, dict):
        raise InputError(f"request: must be a JSON object, got {type(req).__name__}")
    model = _string(req, "model", required=True)
    adapter, lora = _string(req, "adapter"), _string(req, "lora")  # two spellings of one field
    if adapter is not None and lora is not None and adapter != lora:
        raise InputError(f"request: 'adapter' {adapter!r} and 'lora' {lora!r} name different adapters; give one")
    adapter = lora if adapter is None else adapter
    conversation = _string(req, "conversation_id")
    task = _string(req, "task")
    system, last, turns, system_at = _messages(req)
    final = last[1]
    temperature = _number(req, "temperature", 1.0)  # checked in this order: the first bad field is the one named
    top_k = _number(req, "top_k", None, integer=True)
    seed = _number(req, "seed", None, integer=True)
    c = {
        "v": KEY_VERSION, "model": model, "adapter": adapter, "conversation": conversation, "task": task,
        "system": system, "final": final, "temperature": temperature, "top_p": _number(req, "top_p", 1.0),
        "top_k": top_k, "max_tokens": _number(req, "max_tokens", None, integer=True), "seed": seed,
        "stop": _stop(req), "response_format": req.get("response_format"), "tools": req.get("tools"),
        "sampling": {k: v for k, v in req.items() if k not in _SEMANTIC and k not in TRANSPORT} or None,
        "turns": turns,
    }
    if len(last) == 3:  # only when present: the keys of plain final messages stay what they were
        c["final_extra"] = last[2]
    if any(system_at):  # a system message after another turn: where it stands is keyed (leading ones: unchanged keys)
        c["system_at"] = system_at
    if "messages" not in req:  # a raw prompt continues text where a chat message is answered: other answers
        c["completion"] = 1
    return c


def _encode_canonical(c: dict[str, Any]) -> str:
    """``_CANONICAL(c)``, the same characters, for the dict ``_compute_key`` builds: its keys in sorted order and
    every value but the two free-form ones already of a known plain type (str, int, float, None; lists of str and
    of (str, str)), each encoded as the JSON encoder does (``encode_basestring``, ``int``/``float`` repr, ``null``).
    Inline, without a helper call per value: ~2 us where the generic encoder (sorting, type dispatch per value)
    took ~5 us. Property-tested against ``_CANONICAL`` on random requests."""
    enc = _ENC
    adapter, conversation, task = c["adapter"], c["conversation"], c["task"]
    temperature, top_p, top_k = c["temperature"], c["top_p"], c["top_k"]
    max_tokens, seed, response_format, tools = c["max_tokens"], c["seed"], c["response_format"], c["tools"]
    system = ",".join([f"[{enc(t[0])},{enc(t[1])}]" if len(t) == 2 else _CANONICAL(t) for t in c["system"]])
    turns = ",".join([f"[{enc(t[0])},{enc(t[1])}]" if len(t) == 2 else _CANONICAL(t) for t in c["turns"]])
    final_extra = f',"final_extra":{_CANONICAL(c["final_extra"])}' if "final_extra" in c else ""
    sampling = c["sampling"]
    stop = ",".join([enc(s) for s in c["stop"]])
    completion = '"completion":1,' if "completion" in c else ""
    system_at = f',"system_at":[{",".join(map(str, c["system_at"]))}]' if "system_at" in c else ""
    return (f'{{"adapter":{"null" if adapter is None else enc(adapter)},{completion}'
            f'"conversation":{"null" if conversation is None else enc(conversation)},"final":{enc(c["final"])}'
            f'{final_extra},'
            f'"max_tokens":{"null" if max_tokens is None else repr(max_tokens)},"model":{enc(c["model"])},'
            f'"response_format":{"null" if response_format is None else _CANONICAL(response_format)},'
            f'"sampling":{"null" if sampling is None else _CANONICAL(sampling)},'
            f'"seed":{"null" if seed is None else repr(seed)},"stop":[{stop}],"system":[{system}]{system_at},'
            f'"task":{"null" if task is None else enc(task)},'
            f'"temperature":{"null" if temperature is None else repr(temperature)},'
            f'"tools":{"null" if tools is None else _CANONICAL(tools)},'
            f'"top_k":{"null" if top_k is None else repr(top_k)},"top_p":{"null" if top_p is None else repr(top_p)},'
            f'"turns":[{turns}],"v":{c["v"]!r}}}')


def semantic_fields() -> frozenset[str]:
    """The request fields the key reads by name (every other field but ``TRANSPORT`` is keyed as canonical JSON)."""
    return frozenset(_SEMANTIC)
