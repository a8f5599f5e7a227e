"""Every environment variable trtforge reads, declared once with its default and meaning.

Library code reads the environment only through ``get`` / ``get_int`` with a ``Knob`` from this module, so
``KNOBS`` is the complete list (a test greps the sources for other ``os.environ`` reads). Values are read at call
time, never cached at import, so a test or a caller can change them with ``os.environ`` / ``monkeypatch.setenv``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import InputError


@dataclass(frozen=True)
class Knob:
    """One environment variable: ``default`` is what an unset variable means."""

    name: str
    default: str
    meaning: str
    owner: str = "trtforge"  # "trtforge" for our own knobs, else the tool whose convention we follow
    kind: str = "text"  # "flag" (0 or 1, read with get_flag), "int" (get_int) or "text"


LORA_ALIAS = Knob("TRTFORGE_LORA_ALIAS", "0",
                  "1: the LoRA plugin's output aliases its y input (needs TensorRT's aliased plugin I/O feature)",
                  kind="flag")
LORA_SIMPLE_MAX_TOKENS = Knob("TRTFORGE_LORA_SIMPLE_MAX_TOKENS", "0",
                              "batches of at most this many tokens run the scratch-free LoRA kernel (0: never)",
                              kind="int")
TEST_KILL_ONCE_DIR = Knob("TRTFORGE_TEST_KILL_ONCE_DIR", "",
                          "tests only: a build-matrix worker SIGKILLs itself once, leaving a marker in this folder")
TEST_KILL_AT = Knob("TRTFORGE_TEST_KILL_AT", "",
                    "tests only: POINT[:SIGNAL] makes a command signal itself (default SIGKILL) at that commit step "
                    "(core/staging.py fault_point)")
TEST_NO_EXCHANGE = Knob("TRTFORGE_TEST_NO_EXCHANGE", "",
                        "tests only: 1 replaces folders by the two-rename swap instead of renameat2(RENAME_EXCHANGE)")
POLYGRAPHY_USE_TENSORRT_RTX = Knob("POLYGRAPHY_USE_TENSORRT_RTX", "0",
                                   "1: Polygraphy builds and runs with tensorrt_rtx instead of tensorrt",
                                   owner="polygraphy")
DIRECT_WRITE = Knob("TRTFORGE_DIRECT_WRITE", "1",
                    "0: the engine plan is written through the page cache instead of with O_DIRECT", kind="flag")
XDG_CACHE_HOME = Knob("XDG_CACHE_HOME", "", "cache root (the compiled LoRA kernels go to <it>/trtforge/ptx; "
                      "default ~/.cache)", owner="XDG base directories")
CUDA_HOME = Knob("CUDA_HOME", "", "CUDA toolkit folder searched for nvcc when it is not on PATH", owner="CUDA")
CUDA_PATH = Knob("CUDA_PATH", "", "CUDA toolkit folder searched for nvcc after CUDA_HOME", owner="CUDA")
TRITON_INTERPRET = Knob("TRITON_INTERPRET", "0", "1: Triton runs kernels in its CPU interpreter (set around the LoRA "
                        "Triton kernel's decoration; Triton reads it when it is imported and decorates)",
                        owner="Triton")

RAY_HEAD_GRACE_S = Knob("TRTFORGE_RAY_HEAD_GRACE_S", "10",
                        "build-matrix --executor ray: seconds the Ray head may not answer before the unfinished cells "
                        "are reported failed (build_engine/matrix/ray_watch.py)", kind="int")
RAY_RECONNECT = Knob("RAY_gcs_rpc_server_reconnect_timeout_s", "",
                     "how long Ray's core worker waits for a lost head before ending the process; build-matrix's "
                     "driver sets it high for itself unless it is set (TRTFORGE_RAY_HEAD_GRACE_S decides)",
                     owner="Ray")

KNOBS: tuple[Knob, ...] = (LORA_ALIAS, LORA_SIMPLE_MAX_TOKENS, TEST_KILL_ONCE_DIR, TEST_KILL_AT, TEST_NO_EXCHANGE,
                           DIRECT_WRITE, POLYGRAPHY_USE_TENSORRT_RTX, XDG_CACHE_HOME, CUDA_HOME, CUDA_PATH,
                           TRITON_INTERPRET, RAY_HEAD_GRACE_S, RAY_RECONNECT)


def get(knob: Knob) -> str:
    """The variable's value, or the knob's default when it is unset (an empty value is returned as is)."""
    return os.environ.get(knob.name, knob.default)


def get_int(knob: Knob) -> int:
    """An integer knob; unset or empty means the default."""
    value = get(knob) or knob.default
    try:
        return int(value)
    except ValueError as exc:
        raise InputError(f"environment variable {knob.name}={value!r} is not an integer; unset it or give one "
                         f"({knob.meaning})") from exc


def get_flag(knob: Knob) -> bool:
    """A 0/1 switch; unset or empty means the default. Anything else is an InputError naming the variable: 'true'
    or 'off' read as 'not 1' (or 'not 0') silently did the opposite of what was meant."""
    value = (get(knob) or knob.default).strip()
    if value not in ("0", "1"):
        raise InputError(f"environment variable {knob.name}={value!r} is not 0 or 1; set it to 0 or 1, or unset it "
                         f"({knob.meaning})")
    return value == "1"


def check_all() -> None:
    """Every flag and integer knob read once (InputError naming a bad one): the CLI calls it before a command
    starts, so a bad value is refused up front, not deep inside a build (or in a TensorRT callback)."""
    for knob in KNOBS:
        if knob.kind == "flag":
            get_flag(knob)
        elif knob.kind == "int":
            get_int(knob)


@contextlib.contextmanager
def override(knob: Knob, value: str | None) -> Iterator[None]:
    """Set (``None``: unset) a variable for the duration of a block, then restore what was there: for a library
    that reads its switch once, at a moment we choose (e.g. Triton's ``TRITON_INTERPRET`` at decoration time)."""
    saved = os.environ.get(knob.name)
    if value is None:
        os.environ.pop(knob.name, None)
    else:
        os.environ[knob.name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(knob.name, None)
        else:
            os.environ[knob.name] = saved
