"""GPU profiles: frozen, strictly validated settings for one target GPU (DESIGN section 6).

A profile is a TOML file. The built-in ones (``a10``, ``a100``, ``h100``) ship as package data of
``trtforge.profiles``; users may pass a path to their own file. Validation is strict because a typo in a profile
silently falls back to a default otherwise: every unknown key is an error naming the nearest valid key, and every
value is checked for type and range (min <= opt <= max, fractions in (0, 1], no fp8 on a GPU without fp8).

The loader only reads text and builds dataclasses: nothing here imports TensorRT.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from trtforge.build_engine.core.errors import ProfileError

__all__ = [
    "BuilderSettings", "Hardware", "KVSettings", "LoraSettings", "Precision", "Profile", "Range", "ShapeProfile",
    "list_profiles", "load_profile", "parse_profile", "profile_to_dict",
]

DTYPES = ("fp16", "bf16")
# First compute capability with FP8 Tensor Cores (Ada SM 8.9; Hopper SM 9.0) and with bf16 (Ampere SM 8.0).
FP8_MIN_CC = (8, 9)
BF16_MIN_CC = (8, 0)


@dataclass(frozen=True)
class Range:
    """One dynamic dimension's optimization range: ``1 <= min <= opt <= max``."""

    min: int
    opt: int
    max: int


@dataclass(frozen=True)
class ShapeProfile:
    """One TensorRT optimization profile for ``input_ids [batch, sequence]``."""

    name: str
    batch: Range
    sequence: Range


@dataclass(frozen=True)
class Hardware:
    """Datasheet facts. TFLOP/s are dense (no 2:4 sparsity); ``fp8_tflops`` is None on GPUs without fp8."""

    name: str
    compute_capability: str
    memory_gb: float
    memory_bandwidth_gbs: float
    fp16_tflops: float
    bf16_tflops: float
    fp8_tflops: float | None
    sm_count: int


@dataclass(frozen=True)
class Precision:
    dtype: Literal["fp16", "bf16"]
    allow_fp8: bool


@dataclass(frozen=True)
class BuilderSettings:
    optimization_level: int
    workspace_mb: int
    aux_streams: int


@dataclass(frozen=True)
class KVSettings:
    tokens_per_block: int
    memory_fraction: float


@dataclass(frozen=True)
class LoraSettings:
    tile: int


@dataclass(frozen=True)
class Profile:
    """A validated GPU profile. ``source`` is the file it was read from."""

    name: str
    description: str
    source: str
    hardware: Hardware
    precision: Precision
    builder: BuilderSettings
    shapes: tuple[ShapeProfile, ...]
    kv: KVSettings
    lora: LoraSettings


# ----------------------------------------------------------------------------------------------------------- schema
# Each table's keys, and whether they are required. Used both for the unknown-key check and nearest-key hints.
_TOP = {"name": False, "description": True, "hardware": True, "precision": True, "builder": True,
        "shapes": True, "kv": True, "lora": True}
_HARDWARE = {"name": True, "compute_capability": True, "memory_gb": True, "memory_bandwidth_gbs": True,
             "fp16_tflops": True, "bf16_tflops": True, "fp8_tflops": False, "sm_count": True}
_PRECISION = {"dtype": True, "allow_fp8": False}
_BUILDER = {"optimization_level": True, "workspace_mb": True, "aux_streams": False}
_SHAPE = {"name": True, "batch": True, "sequence": True}
_RANGE = {"min": True, "opt": True, "max": True}
_KV = {"tokens_per_block": True, "memory_fraction": True}
_LORA = {"tile": True}


class _Reader:
    """Validates one table of one file; every error names the file, the dotted key and what is allowed."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> ProfileError:
        return ProfileError(f"profile {self.source}: {key}: {problem}")

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
            raise self.fail(key, f"value {value} out of range; allowed: an integer {allowed}")
        return value

    def positive(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"must be a number, got {_show(value)}")
        if not value > 0 or value != value or value == float("inf"):
            raise self.fail(key, f"value {value} not allowed; must be a finite number > 0")
        return float(value)

    def range(self, data: Any, key: str) -> Range:
        t = self.table(data, key, _RANGE)
        r = Range(*(self.integer(t[k], f"{key}.{k}", 1) for k in ("min", "opt", "max")))
        if not r.min <= r.opt <= r.max:
            raise self.fail(key, f"min={r.min}, opt={r.opt}, max={r.max} not allowed; need min <= opt <= max")
        return r


def _show(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _cc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def parse_profile(data: dict[str, Any], source: str, default_name: str) -> Profile:
    """Validate parsed TOML ``data`` (from ``source``) into a Profile; raises ProfileError."""
    r = _Reader(source)
    top = r.table(data, "", _TOP)
    name = r.string(top.get("name", default_name), "name")
    description = r.string(top["description"], "description")

    h = r.table(top["hardware"], "hardware", _HARDWARE)
    cc = r.string(h["compute_capability"], "hardware.compute_capability")
    if not re.fullmatch(r"\d{1,2}\.\d", cc):
        raise r.fail("hardware.compute_capability",
                     f"value {cc!r} not allowed; write major.minor as a string, e.g. \"8.0\"")
    fp8 = h.get("fp8_tflops")
    hardware = Hardware(
        name=r.string(h["name"], "hardware.name"),
        compute_capability=cc,
        memory_gb=r.positive(h["memory_gb"], "hardware.memory_gb"),
        memory_bandwidth_gbs=r.positive(h["memory_bandwidth_gbs"], "hardware.memory_bandwidth_gbs"),
        fp16_tflops=r.positive(h["fp16_tflops"], "hardware.fp16_tflops"),
        bf16_tflops=r.positive(h["bf16_tflops"], "hardware.bf16_tflops"),
        fp8_tflops=None if fp8 is None else r.positive(fp8, "hardware.fp8_tflops"),
        sm_count=r.integer(h["sm_count"], "hardware.sm_count", 1),
    )
    if hardware.fp8_tflops is not None and _cc(cc) < FP8_MIN_CC:
        raise r.fail("hardware.fp8_tflops", f"compute capability {cc} has no fp8 Tensor Cores (needs >= 8.9); "
                     "remove the key")

    p = r.table(top["precision"], "precision", _PRECISION)
    dtype = r.string(p["dtype"], "precision.dtype")
    if dtype not in DTYPES:
        raise r.fail("precision.dtype", f"value {dtype!r} not allowed; allowed: {', '.join(DTYPES)}")
    if dtype == "bf16" and _cc(cc) < BF16_MIN_CC:
        raise r.fail("precision.dtype", f"bf16 needs compute capability >= 8.0, hardware is {cc}; use \"fp16\"")
    allow_fp8 = r.boolean(p.get("allow_fp8", False), "precision.allow_fp8")
    if allow_fp8 and (hardware.fp8_tflops is None or _cc(cc) < FP8_MIN_CC):
        raise r.fail("precision.allow_fp8", f"true not allowed: {hardware.name} (compute capability {cc}) has no "
                     "fp8 Tensor Cores (needs >= 8.9 and hardware.fp8_tflops); set it to false")
    precision = Precision(dtype=dtype, allow_fp8=allow_fp8)  # type: ignore[arg-type]

    b = r.table(top["builder"], "builder", _BUILDER)
    builder = BuilderSettings(
        optimization_level=r.integer(b["optimization_level"], "builder.optimization_level", 0, 5),
        workspace_mb=r.integer(b["workspace_mb"], "builder.workspace_mb", 1),
        aux_streams=r.integer(b.get("aux_streams", 0), "builder.aux_streams", 0),
    )

    raw_shapes = top["shapes"]
    if not isinstance(raw_shapes, list) or not raw_shapes:
        raise r.fail("shapes", f"must be one or more [[shapes]] tables, got {_show(raw_shapes)}")
    shapes: list[ShapeProfile] = []
    for i, item in enumerate(raw_shapes):
        where = f"shapes[{i}]"
        s = r.table(item, where, _SHAPE)
        sp = ShapeProfile(name=r.string(s["name"], f"{where}.name"), batch=r.range(s["batch"], f"{where}.batch"),
                          sequence=r.range(s["sequence"], f"{where}.sequence"))
        if any(prev.name == sp.name for prev in shapes):
            raise r.fail(f"{where}.name", f"duplicate shape profile name {sp.name!r}; names must be unique")
        shapes.append(sp)

    k = r.table(top["kv"], "kv", _KV)
    fraction = k["memory_fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise r.fail("kv.memory_fraction", f"value {fraction!r} not allowed; must be a number in (0, 1]")
    kv = KVSettings(tokens_per_block=r.integer(k["tokens_per_block"], "kv.tokens_per_block", 1, 4096),
                    memory_fraction=float(fraction))

    lo = r.table(top["lora"], "lora", _LORA)
    tile = r.integer(lo["tile"], "lora.tile", 1, 4096)
    if tile & (tile - 1):
        raise r.fail("lora.tile", f"value {tile} not allowed; must be a power of two (e.g. 32, 64, 128)")

    return Profile(name=name, description=description, source=source, hardware=hardware, precision=precision,
                   builder=builder, shapes=tuple(shapes), kv=kv, lora=LoraSettings(tile=tile))


# ---------------------------------------------------------------------------------------------------------- loading
def _builtin_dir() -> Any:
    return resources.files("trtforge.profiles")


def list_profiles() -> list[str]:
    """Names of the built-in profiles (the ``*.toml`` files shipped in ``trtforge.profiles``), sorted."""
    return sorted(p.name[: -len(".toml")] for p in _builtin_dir().iterdir() if p.name.endswith(".toml"))


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path


def load_profile(name_or_path: str) -> Profile:
    """Load a built-in profile by name (``"a100"``) or a user profile by path; raises ProfileError."""
    text_name = str(name_or_path)
    names = list_profiles()
    # Built-in names win; anything else that looks like a path (or is an existing file) is read as one.
    if text_name not in names and (_looks_like_path(text_name) or Path(text_name).is_file()):
        path = Path(text_name)
        if path.is_dir():
            raise ProfileError(f"profile {path} is a folder; give a .toml file or one of: {', '.join(names)}")
        if not path.is_file():
            raise ProfileError(f"profile file {path} not found; give an existing .toml file or one of: "
                               f"{', '.join(list_profiles())}")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ProfileError(f"profile file {path}: cannot read it ({exc.strerror})") from exc
        return _parse_bytes(raw, str(path), path.stem)
    if text_name not in names:
        near = difflib.get_close_matches(text_name, names, n=1, cutoff=0.4)
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise ProfileError(f"unknown profile {text_name!r}; {hint}available: {', '.join(names)} "
                           "(or give a path to a .toml file)")
    res = _builtin_dir().joinpath(f"{text_name}.toml")
    return _parse_bytes(res.read_bytes(), str(res), text_name)


def _parse_bytes(raw: bytes, source: str, default_name: str) -> Profile:
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProfileError(f"profile {source}: not UTF-8 text; save it as UTF-8 TOML") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile {source}: invalid TOML: {exc}; fix the syntax") from exc
    return parse_profile(data, source, default_name)


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """Plain JSON-ready dict of every field (shapes as a list)."""
    d = asdict(profile)
    d["shapes"] = [asdict(s) for s in profile.shapes]
    return d
