"""A JSON file a user gives with one key twice in an object is refused, naming the key (Python's reader kept the
last value, silently; other readers keep the first): an engine's manifest.json, a PEFT adapter_config.json, a
safetensors header (a tensor named twice), a request for ``cache key``. kv-plan configs and Mooncake traces:
tests/scheduler/test_inputs_r10.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge_testing import assert_one_line_error


def test_manifest(tmp_path: Path) -> None:
    from trtforge.build_engine.engine.manifest import Manifest

    (tmp_path / "manifest.json").write_text('{"format": 1, "format": 2}')
    with pytest.raises(InputError, match="'format' is given twice"):
        Manifest.load(tmp_path)


def test_peft_config(tmp_path: Path) -> None:
    from trtforge.plugins.lora.peft_config import read_config

    p = tmp_path / "adapter_config.json"
    p.write_text('{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "r": 4}')
    with pytest.raises(InputError, match="'r' is given twice"):
        read_config(p)


def test_safetensors_header(tmp_path: Path) -> None:
    from trtforge.plugins.lora.pack import read_safetensors

    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    header = f'{{"a": {entry}, "a": {entry}}}'.encode()
    p = tmp_path / "adapter_model.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0\x80?")
    with pytest.raises(InputError, match="'a' is given twice"):
        read_safetensors(p)


def test_cache_key_request(tmp_path: Path, cli) -> None:
    p = tmp_path / "req.json"
    p.write_text('{"model": "m", "messages": [{"role": "user", "content": "hi", "content": "bye"}]}')
    assert_one_line_error(cli("cache", "key", p), 2, "'content' is given twice")
    p.write_text(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    assert cli("cache", "key", p).code == 0
