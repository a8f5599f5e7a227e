"""Request traces: Azure LLM inference CSV, Mooncake JSONL, and a synthetic generator with Mooncake's shape.

- Azure 2023 (Patel et al., Splitwise, ISCA 2024; CC-BY 4.0): ``TIMESTAMP,ContextTokens,GeneratedTokens`` with
  timestamps like ``2023-11-16 18:15:46.6805900`` (Azure 2024: ``2024-05-10 00:00:00.009930+00:00``, the UTC
  offset applied); columns found by name, in any order, extra columns ignored; no prompt content, so no prefix
  sharing.
- Mooncake (Qin et al., FAST 2025; Apache-2.0): JSON lines ``{"timestamp": ms, "input_length", "output_length",
  "hash_ids": [...]}``, one hash id per 512-token prompt block; equal ids mean equal prefix blocks.
- ``synthetic_trace``: Poisson arrivals, lognormal prompt and output lengths, and conversations that extend a
  shared system prompt and their own earlier turns, emitted as Mooncake-style hash ids (deterministic by seed).

A JSONL line may carry ``"adapter": NAME`` and a CSV an ``adapter`` column (empty = the base model): the LoRA
adapter the request runs under. ``assign_adapters`` gives a trace without adapters K synthetic ones with a Zipf
popularity (S-LoRA's workload: a few adapters take most requests).

Both are read as UTF-8 (a leading byte-order mark, as spreadsheet exports write, is skipped; CRLF or LF line
ends). Azure timestamps carry no zone and are read as UTC, so arrivals never depend on the machine's time zone.
A malformed file raises ``InputError`` with one line naming the file, the line number and what is wrong.
Arrival times are seconds from the first request. ``max_requests`` keeps the N earliest arrivals (the file is read
whole, holding at most 2N requests: a file whose rows are not in time order has its earliest requests anywhere).
A zero ``GeneratedTokens`` is read as 1 (the request still produces its first token).
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from trtforge.build_engine.core.errors import InputError
from trtforge.build_engine.core.jsonout import unique_keys, unreadable

from ..request import Request

MOONCAKE_BLOCK_TOKENS = 512
_DIGITS = re.compile(r"[0-9]+")
#: Largest token count of one request a trace may hold (int32: what serving engines size a sequence with).
MAX_REQUEST_TOKENS = 2**31 - 1
#: Largest synthetic trace (``synthetic:N``). A run keeps every request's state to the end: measured here (QA round
#: 9), 100,000 requests took 2.6 GB and 89 s, and 1,000,000 (the old limit) passed 7.8 GB without finishing in 280 s.
MAX_SYNTHETIC_REQUESTS = 200_000


def _int(value: object, path: Path, line: int, key: str, minimum: int = 0, text: bool = True) -> int:
    """``value`` as a token count. ``text``: a CSV cell's string; False for a JSON value, which must be a number
    (``"1000"`` was read as 1000 there, while a string timestamp was refused)."""
    # int() also reads '1_000', '+5' and non-ASCII digits ('\u0665'): a trace field is plain ASCII digits (spaces
    # or tabs around them, as a hand-edited CSV has after its commas, are allowed)
    if isinstance(value, bool) or (isinstance(value, str) and (not text or not _DIGITS.fullmatch(value.strip(" \t")))):
        raise InputError(f"{path}:{line}: {key} must be an integer, got {value!r}")
    try:
        n = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: Infinity
        raise InputError(f"{path}:{line}: {key} must be an integer, got {value!r}") from exc
    if n < minimum or n > MAX_REQUEST_TOKENS or (isinstance(value, float) and value != n):
        raise InputError(f"{path}:{line}: {key} must be an integer from {minimum} to {MAX_REQUEST_TOKENS}, "
                         f"got {value!r}")
    return n


#: A UTC offset after the time, as the Azure 2024 traces write it ("2024-05-10 00:00:00.009930+00:00"), or "Z"
_ZONE = re.compile(r"(?:Z|([+-])([0-9]{2}):?([0-9]{2}))$")


def _timestamp(text: str, path: Path, line: int) -> float:
    try:
        zone = _ZONE.search(text.strip())
        if zone is not None and zone.group(1) is not None and (int(zone.group(2)) > 23 or int(zone.group(3)) > 59):
            raise ValueError(zone.group(0))  # +99:99 shifted every arrival after it by 4 days
        shift = 0.0 if zone is None or zone.group(1) is None else (
            (1 if zone.group(1) == "-" else -1) * (int(zone.group(2)) * 3600 + int(zone.group(3)) * 60))
        head, _, frac = text.strip()[:zone.start() if zone else None].partition(".")
        if frac and not _DIGITS.fullmatch(frac):  # float() would read '46.1e5' as 10,046 s, '46.1_5' as 46.15 s
            raise ValueError(frac)
        # read as UTC, never the machine's zone: a local zone's DST change would shift arrivals by an hour
        base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        return base.timestamp() + shift + (float("0." + frac) if frac else 0.0)
    except ValueError as exc:
        raise InputError(f"{path}:{line}: TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]' (then "
                         "optionally a UTC offset, +HH:MM or Z)") from exc


def _undecodable_line(path: Path) -> int | None:
    """The number of the first line of ``path`` that is not UTF-8 (read again, one line at a time, on that error
    only: the text reader's error gives a position inside its buffer, not a line)."""
    try:
        with open(path, "rb") as fh:
            for number, raw in enumerate(fh, 1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    return number
    except OSError:
        return None
    return None


def _is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"\x1f\x8b"
    except OSError:
        return False


@contextmanager
def _reading(path: Path, kind: str) -> Iterator[None]:
    """Turn a failure to open or decode ``path`` into one ``InputError`` line naming the file."""
    try:
        yield
    except OSError as exc:
        raise InputError(f"{path}: cannot read trace ({exc.strerror or exc}); check the path") from exc
    except UnicodeDecodeError as exc:
        line = _undecodable_line(path)
        if line == 1 and _is_gzip(path):
            raise InputError(f"{path}: gzip-compressed; traces are read uncompressed: gunzip it first") from exc
        where = f"{path}:{line}" if line else str(path)
        raise InputError(f"{where}: not UTF-8 text ({exc.reason}); a {kind} trace is UTF-8: re-save it as UTF-8 or "
                         "fix the row") from exc
    except csv.Error as exc:  # a NUL byte, an over-long field
        raise InputError(f"{path}: not a readable {kind} file ({exc})") from exc


def read_azure_csv(path: str | Path, max_requests: int | None = None) -> list[Request]:
    p = Path(path)
    out: list[Request] = []
    rows = 0
    with _reading(p, "CSV"), open(p, newline="", encoding="utf-8-sig") as fh:  # -sig: a BOM is not the header
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        need = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        if not set(need) <= set(header):  # columns are found by name: any order, extra columns allowed
            raise InputError(f"{p}:1: header must name the columns {','.join(need)} (any order), got "
                             f"{','.join(header) or 'nothing'}")
        at = [header.index(name) for name in need]
        col = header.index("adapter") if "adapter" in header else -1
        for row in reader:
            line = reader.line_num
            if not row or not "".join(row).strip():
                continue
            if len(row) <= max(at):
                raise InputError(f"{p}:{line}: expected at least {max(at) + 1} fields ({','.join(header)}), "
                                 f"got {len(row)}")
            t = _timestamp(row[at[0]], p, line)
            prompt = _int(row[at[1]].strip(), p, line, "ContextTokens", 1)
            new = max(1, _int(row[at[2]].strip(), p, line, "GeneratedTokens", 0))
            adapter = row[col].strip() or None if 0 <= col < len(row) else None
            out.append(Request(f"azure-{rows}", t, prompt, new, adapter=adapter))
            rows += 1
            out = _earliest(out, max_requests)
    return _sorted(out, p, max_requests)


def read_mooncake_jsonl(path: str | Path, max_requests: int | None = None) -> list[Request]:
    p = Path(path)
    out: list[Request] = []
    rows = 0
    odd = False  # a hash id that Python's hash() does not keep apart from another one (see _dense_ids)
    with _reading(p, "JSONL"), open(p, encoding="utf-8-sig") as fh:  # UTF-8, an optional BOM skipped
        for line_no, text in enumerate(fh, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text, object_pairs_hook=unique_keys)
            except json.JSONDecodeError as exc:
                raise InputError(f"{p}:{line_no}: not valid JSON ({exc.msg})") from exc
            except ValueError as exc:  # a key twice; json reads no integer of more than 4300 digits
                raise InputError(f"{p}:{line_no}: {unreadable(exc)}; fix the row") from exc
            except RecursionError as exc:
                raise InputError(f"{p}:{line_no}: JSON nested too deeply; each line is one flat object") from exc
            if not isinstance(obj, dict):
                raise InputError(f"{p}:{line_no}: each line must be a JSON object")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in obj:
                    raise InputError(f"{p}:{line_no}: missing key {key!r} (Mooncake format: timestamp, "
                                     "input_length, output_length, hash_ids)")
            ts = obj["timestamp"]
            # an integer past float's range (1 followed by 400 zeros) is a number json reads: float() of it raised
            if (isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0
                    or (isinstance(ts, int) and ts.bit_length() > 1023) or not math.isfinite(ts)):
                raise InputError(f"{p}:{line_no}: timestamp must be a number of milliseconds >= 0, got {ts!r}")
            t = float(ts) / 1000.0
            hashes = obj.get("hash_ids")
            hashes = [] if hashes is None else hashes  # null, as absent: no prefix blocks (as adapter: null)
            if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                       for h in hashes):
                raise InputError(f"{p}:{line_no}: hash_ids must be a list of integers")
            adapter = obj.get("adapter")
            if adapter is not None and (not isinstance(adapter, str) or not adapter):
                raise InputError(f"{p}:{line_no}: adapter must be a non-empty string (the LoRA adapter's name), "
                                 f"got {adapter!r}")
            prompt = _int(obj["input_length"], p, line_no, "input_length", 1, text=False)
            if len(hashes) > -(-prompt // MOONCAKE_BLOCK_TOKENS):  # one id per 512-token prompt block, no more
                raise InputError(f"{p}:{line_no}: {len(hashes)} hash_ids for input_length {prompt}: at most "
                                 f"{-(-prompt // MOONCAKE_BLOCK_TOKENS)} (one per {MOONCAKE_BLOCK_TOKENS}-token "
                                 "prompt block); fix the row")
            odd = odd or not all(0 <= h < _HASH_MODULUS for h in hashes)
            out.append(Request(f"mooncake-{rows}", t, prompt,
                               max(1, _int(obj["output_length"], p, line_no, "output_length", 0, text=False)),
                               block_hashes=tuple(hashes), hash_block_tokens=MOONCAKE_BLOCK_TOKENS,
                               adapter=adapter))
            rows += 1
            out = _earliest(out, max_requests)
    return _sorted(_dense_ids(out) if odd else out, p, max_requests)


# hash() of an int is the int modulo 2**61 - 1 (and hash(-1) == hash(-2)): ids outside [0, 2**61 - 1) can hash alike
_HASH_MODULUS = (1 << 61) - 1


def _dense_ids(reqs: list[Request]) -> list[Request]:
    """The same trace with its hash ids renumbered 0, 1, 2... in order of appearance (equal ids stay equal, unequal
    ones stay apart). The prefix cache chains ``hash()`` of the ids, so ids -1 and -2, or 0 and 2**61 - 1, were the
    same block: requests with different prompts shared prefix KV. Traces of ids in [0, 2**61 - 1) keep theirs."""
    dense: dict[int, int] = {}
    return [replace(r, block_hashes=tuple(dense.setdefault(h, len(dense)) for h in r.block_hashes)) for r in reqs]


def _earliest(reqs: list[Request], n: int | None) -> list[Request]:
    """``reqs`` (in file order, or sorted then appended to) cut to its ``n`` earliest arrivals once it holds 2n: a
    stable sort, so ties keep file order. The first n rows of the file were kept before, whatever their times."""
    if n is None or len(reqs) < 2 * n:
        return reqs
    return sorted(reqs, key=lambda r: r.arrival)[:n]


def _sorted(reqs: list[Request], p: Path, n: int | None = None) -> list[Request]:
    """In arrival order (stable: ties keep file order), the ``n`` earliest (all: None), as seconds from the earliest
    arrival: a file whose rows are not in time order made its first row time 0, so the earlier requests arrived at
    negative times."""
    if not reqs:
        raise InputError(f"{p}: the trace holds no requests")
    out = sorted(reqs, key=lambda r: r.arrival)[:n]
    t0 = out[0].arrival
    return [replace(r, arrival=r.arrival - t0) for r in out]


def synthetic_trace(num_requests: int = 2000, rate: float = 4.0, seed: int = 0, *,
                    prompt_median: int = 2000, prompt_sigma: float = 1.0, output_median: int = 250,
                    output_sigma: float = 0.8, system_prompt_blocks: int = 2, conversations: int = 300,
                    max_prompt: int = 100_000, max_output: int = 2000) -> list[Request]:
    """A Mooncake-shaped trace: Poisson arrivals at ``rate``/s, lognormal lengths, shared prefixes.

    Every request starts with a shared system prompt (``system_prompt_blocks`` 512-token blocks); it belongs to
    one of ``conversations`` conversations, repeats that conversation's previous prompt as its prefix and adds a
    new turn of lognormal length (median ``prompt_median``). Deterministic for a given seed.
    """
    if num_requests < 1 or rate <= 0:
        raise InputError("synthetic trace: num_requests must be >= 1 and rate > 0")
    rng = random.Random(seed)
    next_id = system_prompt_blocks
    history: dict[int, list[int]] = {}
    out: list[Request] = []
    t = 0.0
    for i in range(num_requests):
        t += rng.expovariate(rate)
        conv = rng.randrange(conversations)
        prefix = history.get(conv, list(range(system_prompt_blocks)))
        turn = int(max(16, rng.lognormvariate(math.log(prompt_median), prompt_sigma)))
        if len(prefix) * MOONCAKE_BLOCK_TOKENS + turn > max_prompt:  # conversation too long: start over
            prefix = list(range(system_prompt_blocks))
        length = min(max_prompt, len(prefix) * MOONCAKE_BLOCK_TOKENS + turn)
        hashes = prefix + [next_id + k for k in range(math.ceil(length / MOONCAKE_BLOCK_TOKENS) - len(prefix))]
        next_id += len(hashes) - len(prefix)
        # the next turn repeats this prompt's full blocks (a partial last block is re-sent with new content)
        history[conv] = hashes[:length // MOONCAKE_BLOCK_TOKENS]
        new = int(min(max_output, max(1, rng.lognormvariate(math.log(output_median), output_sigma))))
        out.append(Request(f"synthetic-{i}", t, length, new, block_hashes=tuple(hashes),
                           hash_block_tokens=MOONCAKE_BLOCK_TOKENS))
    return out


def assign_adapters(reqs: list[Request], k: int, seed: int = 0, zipf_s: float = 1.0) -> list[Request]:
    """Give each request one of ``k`` adapters ``adapter-0..k-1`` drawn with Zipf popularity (P(i) ~ 1/(i+1)^s),
    deterministic by seed; requests that already name an adapter keep it."""
    if k < 1:
        raise InputError(f"--adapters must be >= 1, got {k}")
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** zipf_s for i in range(k)]
    names = [f"adapter-{i}" for i in range(k)]
    picks = rng.choices(names, weights=weights, k=len(reqs))
    return [r if r.adapter is not None else replace(r, adapter=a) for r, a in zip(reqs, picks, strict=True)]


def load_trace(spec: str, max_requests: int | None = None, seed: int = 0) -> list[Request]:
    """``synthetic`` (or ``synthetic:N``), a ``.csv`` (Azure) or a ``.jsonl`` (Mooncake) path."""
    if spec == "synthetic" or spec.startswith("synthetic:"):
        n = max_requests or 2000
        if ":" in spec:
            digits = spec.split(":", 1)[1]
            if not (digits.isascii() and digits.isdigit()):  # int() took " 5" and "1_0", a trace file's counts do not
                raise InputError(f"--trace {spec!r}: write synthetic:N with N a number of requests (digits only)")
            stripped = digits.lstrip("0") or "0"
            n = int(stripped) if len(stripped) <= 12 else MAX_SYNTHETIC_REQUESTS + 1  # no 4300-digit int()
        if not 1 <= min(n, max_requests or n) <= MAX_SYNTHETIC_REQUESTS:
            raise InputError(f"--trace {spec[:40]}: N must be from 1 to {MAX_SYNTHETIC_REQUESTS:,} requests (a run "
                             "keeps every request's state: 100,000 take about 2.6 GB)")
        return synthetic_trace(min(n, max_requests or n), seed=seed)
    p = Path(spec)
    if p.suffix.lower() == ".csv":
        return read_azure_csv(p, max_requests)
    if p.suffix.lower() in (".jsonl", ".json"):
        return read_mooncake_jsonl(p, max_requests)
    if p.suffix.lower() == ".gz":
        raise InputError(f"--trace {spec}: gzip-compressed; traces are read uncompressed: gunzip it first")
    raise InputError(f"--trace {spec}: unknown trace format; give an Azure .csv, a Mooncake .jsonl or 'synthetic'")
