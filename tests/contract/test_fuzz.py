"""Property-based fuzzing of the input parsers, in-process (issue 11): profile TOML, trace lines, HF configs and
PEFT adapter configs. Any input either parses to a valid object or raises the project's InputError; never another
exception (a KeyError, OverflowError, RecursionError, ... would be an "internal error" exit 3 at the CLI)."""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtforge.build_engine.core.errors import InputError

from . import fixtures as fx

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Values a hand-edited file holds: the right type at absurd sizes, the wrong type, non-finite floats.
_SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(), st.text(max_size=8),
)
JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6),
                                                                                           inner, max_size=3),
                    max_leaves=8)


_TMP = tempfile.TemporaryDirectory(prefix="trtforge-fuzz-")  # removed at exit; one file per example
_COUNT = iter(range(10**9))


def _file(text: str, name: str) -> Path:
    path = Path(_TMP.name) / f"{next(_COUNT)}-{name}"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


# -------------------------------------------------------------------------------------------------- profile TOML
_TOML_VALUES = st.sampled_from(["0", "-1", "9223372036854775807", "18446744073709551616", "nan", "inf", "-inf",
                                "1.5", "1e300", '"x"', '""', "[1, 2]", "[]", "{ a = 1 }", "true",
                                "{ min = 1, opt = 1, max = 0 }", "{ min = 9223372036854775807, opt = 1, max = 1 }"])


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 200), _TOML_VALUES), min_size=1, max_size=4))
def test_profile_toml_parses_or_input_error(edits: list[tuple[int, str]]) -> None:
    from trtforge.profiles.loader import _parse_bytes

    lines = fx.A100.read_text().splitlines()
    assigns = [i for i, ln in enumerate(lines) if "=" in ln and not ln.lstrip().startswith("#")]
    for pick, value in edits:
        i = assigns[pick % len(assigns)]
        key = lines[i].split("=", 1)[0]
        lines[i] = f"{key}= {value}"
    try:
        prof = _parse_bytes("\n".join(lines).encode(), "fuzz.toml", "fuzz")
    except InputError:
        return
    assert prof.builder.workspace_mb >= 1 and all(s.sequence.max >= s.sequence.min >= 1 for s in prof.shapes)


@FUZZ
@given(st.binary(max_size=200))
def test_profile_bytes_parse_or_input_error(raw: bytes) -> None:
    from trtforge.profiles.loader import _parse_bytes

    with contextlib.suppress(InputError):
        _parse_bytes(raw, "fuzz.toml", "fuzz")


# -------------------------------------------------------------------------------------------------- trace lines
_TRACE_KEYS = st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids"])


@FUZZ
@given(st.lists(st.dictionaries(_TRACE_KEYS, JSON, max_size=4) | JSON, min_size=1, max_size=3))
def test_mooncake_lines_parse_or_input_error(rows: list[Any]) -> None:
    from trtforge.scheduler.sim.traces import read_mooncake_jsonl

    path = _file("".join(json.dumps(r) + "\n" for r in rows), "t.jsonl")
    try:
        reqs = read_mooncake_jsonl(path)
    except InputError:
        return
    assert reqs and all(r.prompt_tokens >= 1 and r.max_new_tokens >= 1 and math.isfinite(r.arrival) for r in reqs)


@FUZZ
@given(st.lists(st.text(max_size=40), min_size=1, max_size=4))
def test_azure_lines_parse_or_input_error(rows: list[str]) -> None:
    from trtforge.scheduler.sim.traces import read_azure_csv

    path = _file("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n", "t.csv")
    try:
        reqs = read_azure_csv(path)
    except InputError:
        return
    assert all(r.prompt_tokens >= 1 and r.max_new_tokens >= 1 for r in reqs)


# -------------------------------------------------------------------------------------------------- HF configs
_HF_KEYS = st.sampled_from(["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                            "hidden_size", "intermediate_size", "vocab_size", "max_position_embeddings",
                            "tie_word_embeddings", "_name_or_path"])


@FUZZ
@given(st.dictionaries(_HF_KEYS, JSON, max_size=5), st.booleans())
def test_hf_config_parses_or_input_error(over: dict[str, Any], whole: bool) -> None:
    from trtforge.examples.llama import hf_config
    from trtforge.scheduler.kv_plan import ModelSpec

    cfg = {**(hf_config() if whole else {}), **over}
    path = _file(json.dumps(cfg), "config.json")
    try:
        spec = ModelSpec.from_hf_config(path)
    except InputError:
        return
    assert spec.num_params > 0 and spec.kv_bytes_per_token("fp16") > 0


# -------------------------------------------------------------------------------------------------- adapter configs
_AD_KEYS = st.sampled_from(["r", "lora_alpha", "target_modules", "use_rslora", "rank_pattern", "alpha_pattern",
                           "use_dora", "bias", "modules_to_save"])


@FUZZ
@given(st.dictionaries(_AD_KEYS, JSON, max_size=4) | JSON)
def test_adapter_config_parses_or_input_error(cfg: Any) -> None:
    from trtforge.plugins.lora.peft_config import read_config

    path = _file(json.dumps(cfg), "adapter_config.json")
    try:
        ac = read_config(path)
    except InputError:
        return
    r, alpha, targets = ac.r, ac.alpha, ac.targets
    assert isinstance(r, int) and r >= 1 and math.isfinite(alpha) and all(isinstance(t, str) for t in targets)
    for path_ in ("model.layers.0.q_proj", "q_proj", ""):  # every module gets a whole rank and a finite scale
        assert 1 <= ac.rank_of(path_) <= 64 and math.isfinite(ac.scale_of(path_))
