"""A PEFT LoRA adapter's ``adapter_config.json``: rank, alpha, targets, rsLoRA and per-module patterns.

``rank_pattern`` / ``alpha_pattern`` map a pattern to the rank / alpha of the modules it matches (the rest keep ``r``
/ ``lora_alpha``), as PEFT's ``get_pattern_key`` matches: the first key, in the file's order, for which
``re.match(rf"(.*\\.)?({key})$", module_path)`` matches. A module's scale is ``alpha / r`` of its own alpha and rank
(``alpha / sqrt(r)`` with ``use_rslora``). The features whose effect is more than ``scale * B @ A`` on a projection
(DoRA, trained biases, ``modules_to_save``) are refused (InputError) with what to do instead.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtforge.build_engine.core.errors import InputError
from trtforge.build_engine.core.jsonout import unique_keys

from . import spec

Targets = tuple[str, ...] | str  # target_modules: names, or one regular expression (PEFT's two forms)
_PEFT_DEFAULT_ALPHA = 8  # peft.LoraConfig.lora_alpha's default


@dataclass(frozen=True)
class AdapterConfig:
    r: int
    alpha: float
    targets: Targets
    rslora: bool
    rank_pattern: Mapping[str, int]
    alpha_pattern: Mapping[str, float]

    def rank_of(self, path: str) -> int:
        return int(_pattern_value(self.rank_pattern, path, self.r))

    def scale_of(self, path: str) -> float:
        r, alpha = self.rank_of(path), float(_pattern_value(self.alpha_pattern, path, self.alpha))
        return alpha / math.sqrt(r) if self.rslora else alpha / r


def _pattern_value(pattern: Mapping[str, float], path: str, default: float) -> float:
    """PEFT's ``get_pattern_key`` (module docstring): the first key matching ``path``'s end, else ``default``."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", path):
            return value
    return default


def _whole(raw: Any) -> bool:
    ok = isinstance(raw, int) or (isinstance(raw, float) and math.isfinite(raw) and raw.is_integer())
    return ok and not isinstance(raw, bool)


def _finite(raw: Any) -> bool:
    return not isinstance(raw, bool) and isinstance(raw, (int, float)) and math.isfinite(raw)


def _patterns(cfg: Mapping[str, Any], cfg_path: Path) -> tuple[dict[str, int], dict[str, float]]:
    """``rank_pattern`` (whole ranks 1..MAX_RANK) and ``alpha_pattern`` (finite numbers), keys valid patterns."""
    out: list[dict[str, Any]] = []
    for name, ok, what in (("rank_pattern", _whole, f"a whole number from 1 to {spec.MAX_RANK}"),
                           ("alpha_pattern", _finite, "a finite number")):
        raw = cfg.get(name) or {}
        if not isinstance(raw, dict):
            raise InputError(f"{cfg_path}: {name!r} is {raw!r}; it must be an object of module pattern -> {what}")
        for key, value in raw.items():
            try:
                re.compile(rf"(.*\.)?({key})$")
            except re.error as exc:
                raise InputError(f"{cfg_path}: {name} key {key!r} is not a regular expression ({exc}); fix "
                                 "adapter_config.json") from exc
            if not ok(value) or name == "rank_pattern" and not 1 <= value <= spec.MAX_RANK:
                raise InputError(f"{cfg_path}: {name}[{key!r}] is {value!r}; it must be {what}")
        out.append({k: (int(v) if name == "rank_pattern" else float(v)) for k, v in raw.items()})
    return out[0], out[1]


def read_config(cfg_path: Path) -> AdapterConfig:
    """r (a whole number, never truncated), lora_alpha (finite), target_modules (a list of names, or a regular
    expression) and the patterns; refuses the PEFT features ``pack`` cannot represent (module docstring)."""
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8-sig"), object_pairs_hook=unique_keys)  # BOM skipped
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"{cfg_path}: not a readable JSON file ({exc}); re-save the adapter") from exc
    if not isinstance(cfg, dict):
        raise InputError(f"{cfg_path}: the top level must be a JSON object (PEFT's adapter_config.json)")
    raw = cfg.get("r")
    if not _whole(raw):
        raise InputError(f"{cfg_path}: 'r' is {raw!r}; it must be a whole number (the adapter's rank)")
    r = int(raw)  # type: ignore[arg-type]
    _refuse_features(cfg, cfg_path)
    alpha = cfg.get("lora_alpha", _PEFT_DEFAULT_ALPHA)
    if not _finite(alpha):
        raise InputError(f"{cfg_path}: 'lora_alpha' is {alpha!r}; it must be a finite number")
    if not 1 <= r <= spec.MAX_RANK:
        raise InputError(f"{cfg_path}: 'r' is {r}; it must be from 1 to {spec.MAX_RANK}")
    rslora = cfg.get("use_rslora", False)
    if rslora is not None and not isinstance(rslora, bool):  # the string "false" would have meant rsLoRA's scale
        raise InputError(f"{cfg_path}: 'use_rslora' is {rslora!r}; it must be true or false")
    ranks, alphas = _patterns(cfg, cfg_path)
    tm = cfg.get("target_modules") or []
    if isinstance(tm, str):
        try:
            re.compile(tm)
        except re.error as exc:
            raise InputError(f"{cfg_path}: 'target_modules' {tm!r} is not a regular expression ({exc}); give a "
                             "list of module names or a valid pattern") from exc
        return AdapterConfig(r, float(alpha), tm, bool(rslora), ranks, alphas)
    if not isinstance(tm, list) or not all(isinstance(t, str) for t in tm):
        raise InputError(f"{cfg_path}: 'target_modules' is {tm!r}; it must be a list of module names or a regular "
                         "expression")
    return AdapterConfig(r, float(alpha), tuple(tm), bool(rslora), ranks, alphas)


def _refuse_features(cfg: Mapping[str, Any], cfg_path: Path) -> None:
    """The adapter features whose effect is more than ``scale * B @ A`` on a projection (module docstring)."""
    if cfg.get("use_dora"):
        raise InputError(f"{cfg_path}: DoRA adapters (use_dora) are not supported (their magnitude vectors rescale "
                         "the whole weight); merge the adapter into the model or train a plain LoRA")
    if cfg.get("bias") not in (None, "none"):
        raise InputError(f"{cfg_path}: 'bias' is {cfg.get('bias')!r}; only adapters with bias 'none' are supported "
                         "(trained biases are not part of a LoRA slot)")
    if cfg.get("modules_to_save"):
        raise InputError(f"{cfg_path}: 'modules_to_save' {cfg.get('modules_to_save')!r} holds fully trained modules, "
                         "which a LoRA slot cannot carry; merge the adapter into the model instead")
