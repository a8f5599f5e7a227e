"""The GPU profile schema: frozen dataclasses whose fields are the TOML keys, and the strict reader built on them.

Each field is declared once, with ``_key``: how its TOML value is checked and, for an optional key, the value used
when the file omits it. The strict reader (unknown key -> the nearest valid name; missing key), ``profile_rows``
(what ``trtforge profiles NAME`` shows) and ``profile_to_dict`` (``--json``) all walk ``dataclasses.fields``, so a
key is added in one place: a field with ``_key(check)`` (required) or ``_key(check, missing=value)`` (optional).
Rules between keys (min <= opt <= max, fp8 only from SM 8.9, bf16 only from SM 8.0) are in ``_RULES``.

Nothing here imports TensorRT.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Literal, TypeVar

from trtforge.build_engine.core.errors import ProfileError

_T = TypeVar("_T")
DTYPES = ("fp16", "bf16")
# First compute capability with FP8 Tensor Cores (Ada SM 8.9; Hopper SM 9.0) and with bf16 (Ampere SM 8.0).
FP8_MIN_CC = (8, 9)
BF16_MIN_CC = (8, 0)
#: Largest batch or sequence dim of an optimization profile (int32: TensorRT's shape arithmetic and Triton's
#: max_batch_size are 32-bit) and largest builder workspace (1 TiB, beyond any GPU); larger values are refused by
#: name instead of overflowing inside TensorRT.
MAX_DIM = 2**31 - 1
#: The LoRA plugin's fused-kernel tiles (profiles imports no plugin: tests/build_engine/test_profiles.py checks they
#: equal trtforge.plugins.lora.spec.TILE_CHOICES).
LORA_TILES = (32, 64, 128, 256)
MAX_WORKSPACE_MB = 2**20


Check = Callable[["_Reader", Any, str], Any]  # (reader, raw TOML value, dotted key) -> validated value
_REQUIRED = object()
FROM_FILE_NAME = object()  # ``missing`` of Profile.name: the loader supplies the file's stem


def _key(check: Check | None, *, missing: Any = _REQUIRED, toml: bool = True) -> Any:
    """A profile field: ``check`` validates the TOML value; ``missing`` makes the key optional; ``toml=False`` marks
    a field the loader fills (not a key of the file)."""
    return field(metadata={"check": check, "missing": missing, "toml": toml})


def _text(r: _Reader, v: Any, key: str) -> str:
    return r.string(v, key)


def _flag(r: _Reader, v: Any, key: str) -> bool:
    return r.boolean(v, key)


def _number(r: _Reader, v: Any, key: str) -> float:
    return r.positive(v, key)


def _int(low: int, high: int | None = None) -> Check:
    return lambda r, v, key: r.integer(v, key, low, high)


def _cc_text(r: _Reader, v: Any, key: str) -> str:
    cc = r.string(v, key)
    if not re.fullmatch(r"\d{1,2}\.\d", cc):
        raise r.fail(key, f"value {cc!r} not allowed; write major.minor as a string, e.g. \"8.0\"")
    return cc


def _dtype(r: _Reader, v: Any, key: str) -> str:
    dtype = r.string(v, key)
    if dtype not in DTYPES:
        raise r.fail(key, f"value {dtype!r} not allowed; allowed: {', '.join(DTYPES)}")
    return dtype


def _fraction(r: _Reader, v: Any, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise r.fail(key, f"value {v!r} not allowed; must be a number in (0, 1]")
    return float(v)


def _pow2(low: int, high: int) -> Check:
    def check(r: _Reader, v: Any, key: str) -> int:
        n = r.integer(v, key, low, high)
        if n & (n - 1):
            raise r.fail(key, f"value {n} not allowed; must be a power of two (e.g. 32, 64, 128)")
        return n
    return check


def _choice(values: tuple[int, ...], why: str) -> Check:
    def check(r: _Reader, v: Any, key: str) -> int:
        n = r.integer(v, key, 1)
        if n not in values:
            raise r.fail(key, f"value {n} not allowed; choose one of {', '.join(map(str, values))} ({why})")
        return n
    return check


def _table(cls: type) -> Check:
    return lambda r, v, key: r.record(cls, v, key)


@dataclass(frozen=True)
class Range:
    """One dynamic dimension's optimization range: ``1 <= min <= opt <= max``."""

    min: int = _key(_int(1, MAX_DIM))
    opt: int = _key(_int(1, MAX_DIM))
    max: int = _key(_int(1, MAX_DIM))


@dataclass(frozen=True)
class ShapeProfile:
    """One TensorRT optimization profile for ``input_ids [batch, sequence]``."""

    name: str = _key(_text)
    batch: Range = _key(_table(Range))
    sequence: Range = _key(_table(Range))


def _shapes(r: _Reader, v: Any, key: str) -> tuple[ShapeProfile, ...]:
    if not isinstance(v, list) or not v:
        raise r.fail(key, f"must be one or more [[shapes]] tables, got {_show(v)}")
    shapes: list[ShapeProfile] = []
    for i, item in enumerate(v):
        sp = r.record(ShapeProfile, item, f"{key}[{i}]")
        if any(prev.name == sp.name for prev in shapes):
            raise r.fail(f"{key}[{i}].name", f"duplicate shape profile name {sp.name!r}; names must be unique")
        shapes.append(sp)
    return tuple(shapes)


@dataclass(frozen=True)
class Hardware:
    """Datasheet facts. TFLOP/s are dense (no 2:4 sparsity); ``fp8_tflops`` is None on GPUs without fp8."""

    name: str = _key(_text)
    compute_capability: str = _key(_cc_text)
    memory_gb: float = _key(_number)
    memory_bandwidth_gbs: float = _key(_number)
    fp16_tflops: float = _key(_number)
    bf16_tflops: float = _key(_number)
    fp8_tflops: float | None = _key(_number, missing=None)
    sm_count: int = _key(_int(1, MAX_DIM))  # TensorRT takes 32-bit counts: a larger one was a TypeError


@dataclass(frozen=True)
class Precision:
    dtype: Literal["fp16", "bf16"] = _key(_dtype)
    allow_fp8: bool = _key(_flag, missing=False)


@dataclass(frozen=True)
class BuilderSettings:
    optimization_level: int = _key(_int(0, 5))
    workspace_mb: int = _key(_int(1, MAX_WORKSPACE_MB))
    aux_streams: int = _key(_int(0, MAX_DIM), missing=0)


@dataclass(frozen=True)
class KVSettings:
    """``tokens_per_block``: a power of two, as TensorRT-LLM's paged KV cache requires ("tokens_per_block must be
    power of 2"); 48 was planned and simulated, and no TensorRT-LLM engine takes it."""

    tokens_per_block: int = _key(_pow2(1, 4096))
    memory_fraction: float = _key(_fraction)


@dataclass(frozen=True)
class LoraSettings:
    """``tile``: one of the LoRA plugin's tiles (``plugins/lora/spec.py`` TILE_CHOICES, kept equal by a test):
    ``trtforge lora inject --tile`` refuses any other (1 and 4096 passed here as powers of two)."""

    tile: int = _key(_choice(LORA_TILES, "the LoRA plugin's tiles, as trtforge lora inject --tile"))


@dataclass(frozen=True)
class Profile:
    """A validated GPU profile. ``source`` is the file it was read from."""

    name: str = _key(_text, missing=FROM_FILE_NAME)
    description: str = _key(_text)
    source: str = _key(None, toml=False)
    hardware: Hardware = _key(_table(Hardware))
    precision: Precision = _key(_table(Precision))
    builder: BuilderSettings = _key(_table(BuilderSettings))
    shapes: tuple[ShapeProfile, ...] = _key(_shapes)
    kv: KVSettings = _key(_table(KVSettings))
    lora: LoraSettings = _key(_table(LoraSettings))


def toml_keys(cls: type) -> dict[str, bool]:
    """The TOML keys of ``cls``'s table -> whether each is required (from the dataclass fields)."""
    return {f.name: f.metadata["missing"] is _REQUIRED for f in fields(cls) if f.metadata["toml"]}


# ------------------------------------------------------------------------------------------------------------ rules
def _range_rule(r: _Reader, v: Range, where: str) -> None:
    if not v.min <= v.opt <= v.max:
        raise r.fail(where, f"min={v.min}, opt={v.opt}, max={v.max} not allowed; need min <= opt <= max")


def _hardware_rule(r: _Reader, h: Hardware, where: str) -> None:
    if h.fp8_tflops is not None and _cc(h.compute_capability) < FP8_MIN_CC:
        raise r.fail(f"{where}.fp8_tflops", f"compute capability {h.compute_capability} has no fp8 Tensor Cores "
                     "(needs >= 8.9); remove the key")


def _profile_rule(r: _Reader, p: Profile, where: str) -> None:
    cc, hw = p.hardware.compute_capability, p.hardware
    if p.precision.dtype == "bf16" and _cc(cc) < BF16_MIN_CC:
        raise r.fail("precision.dtype", f"bf16 needs compute capability >= 8.0, hardware is {cc}; use \"fp16\"")
    if p.precision.allow_fp8 and (hw.fp8_tflops is None or _cc(cc) < FP8_MIN_CC):
        raise r.fail("precision.allow_fp8", f"true not allowed: {hw.name} (compute capability {cc}) has no "
                     "fp8 Tensor Cores (needs >= 8.9 and hardware.fp8_tflops); set it to false")


# Rules between the keys of one table, run once the table is read: class -> rule(reader, value, dotted key).
_RULES: dict[type, Callable[[_Reader, Any, str], None]] = {
    Range: _range_rule, Hardware: _hardware_rule, Profile: _profile_rule,
}


class _Reader:
    """Validates one table of one file; every error names the file, the dotted key and what is allowed."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> ProfileError:
        return ProfileError(f"profile {self.source}: {key}: {problem}")

    def record(self, cls: type[_T], data: Any, where: str, given: dict[str, Any] | None = None) -> _T:
        """Read table ``data`` into dataclass ``cls``: keys checked against its fields, each value by its check.
        ``given``: values of the fields that are not TOML keys, and defaults that replace ``FROM_FILE_NAME``."""
        given = given or {}
        t = self.table(data, where, toml_keys(cls))
        prefix = f"{where}." if where else ""
        values: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            meta = f.metadata
            if not meta["toml"]:
                values[f.name] = given[f.name]
            elif f.name in t:
                values[f.name] = meta["check"](self, t[f.name], prefix + f.name)
            else:
                values[f.name] = given[f.name] if meta["missing"] is FROM_FILE_NAME else meta["missing"]
        obj = cls(**values)
        rule = _RULES.get(cls)
        if rule is not None:
            rule(self, obj, where)
        return obj

    def table(self, data: Any, where: str, schema: dict[str, bool]) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail(where or "(top level)", f"must be a table, got {_show(data)}")
        prefix = f"{where}." if where else ""
        for key in data:
            if key not in schema:
                # Always name the nearest valid key; list them all when even the nearest is a poor match.
                ratio = {k: difflib.SequenceMatcher(None, key, k).ratio() for k in schema}
                near = max(ratio, key=lambda k: (ratio[k], k.startswith(key[:1])))
                hint = f"did you mean '{prefix}{near}'?"
                if ratio[near] < 0.6:
                    hint += f" valid keys: {', '.join(prefix + k for k in schema)}"
                raise self.fail(prefix + key, f"unknown key; {hint}")
        for key, required in schema.items():
            if required and key not in data:
                raise self.fail(prefix + key, "missing required key")
        return data

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {_show(value)}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {_show(value)}")
        return value

    def integer(self, value: Any, key: str, low: int, high: int | None = None) -> int:
        # bool is an int subclass in Python; `true` is never a valid count.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {_show(value)}")
        if value < low or (high is not None and value > high):
            allowed = f"between {low} and {high}" if high is not None else f">= {low}"
            raise self.fail(key, f"value {_digits(value)} out of range; allowed: an integer {allowed}")
        return value

    def positive(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"must be a number, got {_show(value)}")
        if isinstance(value, int) and value > MAX_NUMBER:  # float() of a 400-digit integer raised OverflowError
            raise self.fail(key, f"value {_digits(value)} not allowed; must be a finite number > 0 and at most 1e300")
        if not value > 0 or value != value or value == float("inf"):
            raise self.fail(key, f"value {value} not allowed; must be a finite number > 0")
        return float(value)


#: The largest number a profile's float key takes (a larger integer has no float).
MAX_NUMBER = 10**300


def _digits(value: int) -> str:
    """An integer as written, or its length when it is long (str() of one of over 4300 digits raises)."""
    if abs(value) < 10**30:
        return str(value)
    return f"{'-' if value < 0 else ''}<an integer of about {int(abs(value).bit_length() * 0.30103) + 1} digits>"


def _show(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"int {_digits(value)}"
    return f"{type(value).__name__} {value!r}"


def _cc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def parse_profile(data: dict[str, Any], source: str, default_name: str) -> Profile:
    """Validate parsed TOML ``data`` (from ``source``) into a Profile; raises ProfileError."""
    return _Reader(source).record(Profile, data, "", {"source": source, "name": default_name})


def profile_rows(profile: Profile) -> list[tuple[str, str]]:
    """(dotted key, value text) for every field below the top level, in declaration order: ``source``, then each
    table's keys; a shape profile's ranges as ``shapes.<name>.<axis>``."""
    rows = [("source", profile.source)]
    for f in fields(Profile):
        value = getattr(profile, f.name)
        if f.name == "shapes":
            for s in value:
                rows += [(f"shapes.{s.name}.{a.name}", _range_text(getattr(s, a.name)))
                         for a in fields(ShapeProfile) if a.name != "name"]
        elif is_dataclass(value):
            rows += [(f"{f.name}.{g.name}", _value_text(getattr(value, g.name))) for g in fields(value)]
    return rows


def _range_text(r: Range) -> str:
    return ", ".join(f"{f.name} {getattr(r, f.name)}" for f in fields(Range))


def _value_text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """Plain JSON-ready dict of every field (shapes as a list)."""
    d = asdict(profile)
    d["shapes"] = [asdict(s) for s in profile.shapes]
    return d
