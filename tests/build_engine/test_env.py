"""core/env.py: knobs read at call time, integer knobs refuse junk with the variable's name, overrides restore."""

from __future__ import annotations

import os

import pytest

from trtforge.build_engine.core import env
from trtforge.build_engine.core.errors import InputError


def test_get_reads_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env.LORA_ALIAS.name, raising=False)
    assert env.get(env.LORA_ALIAS) == env.LORA_ALIAS.default
    monkeypatch.setenv(env.LORA_ALIAS.name, "1")
    assert env.get(env.LORA_ALIAS) == "1"


def test_get_int_default_and_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.LORA_SIMPLE_MAX_TOKENS.name, "")
    assert env.get_int(env.LORA_SIMPLE_MAX_TOKENS) == 0
    monkeypatch.setenv(env.LORA_SIMPLE_MAX_TOKENS.name, "32")
    assert env.get_int(env.LORA_SIMPLE_MAX_TOKENS) == 32
    monkeypatch.setenv(env.LORA_SIMPLE_MAX_TOKENS.name, "many")
    with pytest.raises(InputError, match="TRTFORGE_LORA_SIMPLE_MAX_TOKENS='many'"):
        env.get_int(env.LORA_SIMPLE_MAX_TOKENS)


@pytest.mark.parametrize("before", [None, "7"])
def test_override_restores(before: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    knob = env.Knob("TRTFORGE_TEST_OVERRIDE_PROBE", "", "test only")
    if before is None:
        monkeypatch.delenv(knob.name, raising=False)
    else:
        monkeypatch.setenv(knob.name, before)
    with env.override(knob, "1"):
        assert os.environ[knob.name] == "1"
    assert os.environ.get(knob.name) == before
    with env.override(knob, None):
        assert knob.name not in os.environ
    assert os.environ.get(knob.name) == before
