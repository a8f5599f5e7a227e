"""GPU profiles: frozen, strictly validated settings for one target GPU.

A profile is a TOML file. The built-in ones (``a10``, ``a100``, ``h100``) ship as package data of
``trtforge.profiles``; users may pass a path to their own file. Validation is strict because a typo in a profile
silently falls back to a default otherwise: every unknown key is an error naming the nearest valid key, and every
value is checked for type and range (min <= opt <= max, fractions in (0, 1], no fp8 on a GPU without fp8). The
schema (the dataclasses, whose fields are the keys) is in ``schema.py``; this module finds and reads the files.

The loader only reads text and builds dataclasses: nothing here imports TensorRT.
"""

from __future__ import annotations

import difflib
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from trtforge.build_engine.core.errors import ProfileError

from .schema import (
    BuilderSettings,
    Hardware,
    KVSettings,
    LoraSettings,
    Precision,
    Profile,
    Range,
    ShapeProfile,
    parse_profile,
    profile_rows,
    profile_to_dict,
    toml_keys,
)

__all__ = [
    "BuilderSettings", "Hardware", "KVSettings", "LoraSettings", "Precision", "Profile", "Range", "ShapeProfile",
    "list_profiles", "load_profile", "parse_profile", "profile_rows", "profile_to_dict", "toml_keys",
]


# ---------------------------------------------------------------------------------------------------------- loading
def _builtin_dir() -> Any:
    return resources.files("trtforge.profiles")


def list_profiles() -> list[str]:
    """Names of the built-in profiles (the ``*.toml`` files shipped in ``trtforge.profiles``), sorted."""
    return sorted(p.name[: -len(".toml")] for p in _builtin_dir().iterdir() if p.name.endswith(".toml"))


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path


def load_profile(name_or_path: str, *, bare_file: bool = True) -> Profile:
    """Load a built-in profile by name (``"a100"``) or a user profile by path; raises ProfileError.

    Built-in names win; anything else that looks like a path (ends in .toml, holds a / or \\) is read as one, and so
    is a bare name that is an existing file of the working directory (``--profile mygpu``: the CLI's relative paths
    are the working directory's). ``bare_file=False`` refuses such a name as an unknown profile instead: a matrix's
    refs are relative to the matrix file, which ``matrix.cells.profile_file`` resolves first."""
    text_name = str(name_or_path)
    names = list_profiles()
    if text_name not in names and (_looks_like_path(text_name) or (bare_file and Path(text_name).is_file())):
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
        text = raw.decode("utf-8-sig")  # -sig: a leading BOM (Windows editors) is skipped
    except UnicodeDecodeError as exc:
        raise ProfileError(f"profile {source}: not UTF-8 text; save it as UTF-8 TOML") from exc
    data = read_toml(text, f"profile {source}", "write a profile of plain keys (see 'trtforge profiles a100')",
                     ProfileError)
    return parse_profile(data, source, default_name)


def read_toml(text: str, what: str, fix: str, error: type[Exception]) -> dict[str, Any]:
    """``tomllib.loads(text)``; a file it cannot read is ``error`` (one line naming ``what``): bad syntax, tables or
    arrays nested past Python's stack (RecursionError), an integer of over 4300 digits (int()'s limit)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what}: invalid TOML: {exc}; fix the syntax") from exc
    except RecursionError as exc:
        raise error(f"{what}: not readable TOML (arrays or tables nested too deeply); {fix}") from exc
    except ValueError as exc:  # Python's int() limit: an integer of over 4300 digits
        raise error(f"{what}: holds an integer too long to read ({exc.args[0].split(':')[0]}); write a smaller "
                    "number") from exc
