"""Files a user writes (matrix and profile TOML, adapter_config.json, an HF config.json, a cache request) may start
with a UTF-8 byte-order mark, as Windows editors save them: it is skipped, as the trace readers skip it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trtforge.build_engine.cli import main
from trtforge_testing import REPO, relu_model_file, seeded_rng

BOM = b"\xef\xbb\xbf"


def _write(path: Path, text: str) -> Path:
    path.write_bytes(BOM + text.encode())
    return path


def test_matrix_and_profile_with_a_bom_are_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # old: 'matrix file ...: invalid TOML: Invalid statement (at line 1, column 1)' (exit 2), and the profile's cells
    # refused as 'profile ...: invalid TOML' for the same reason
    relu_model_file(tmp_path / "m.onnx")
    _write(tmp_path / "gpu.toml", (REPO / "profiles" / "a100.toml").read_text().replace('name = "a100"',
                                                                                       'name = "gpu"'))
    _write(tmp_path / "mx.toml", '[matrix]\nprofiles = ["a10", "gpu.toml"]\n[[model]]\npath = "m.onnx"\n')
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    got = {(c["profile"], c["status"]) for c in json.loads(out)["cells"]}
    assert got == {("a10", "planned"), ("gpu", "planned")}


def test_profile_with_a_bom_is_read(tmp_path: Path) -> None:
    # old: 'profile ...: invalid TOML: Invalid statement (at line 1, column 1)' (build --profile FILE, exit 2)
    from trtforge.profiles.loader import load_profile

    _write(tmp_path / "gpu.toml", (REPO / "profiles" / "a10.toml").read_text())
    from dataclasses import replace

    assert load_profile(str(tmp_path / "gpu.toml")) == replace(load_profile("a10"), source=str(tmp_path / "gpu.toml"))


def test_bom_line_numbers_are_the_file_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the skipped mark is no line of its own: a bad key on line 2 is still reported at line 2
    _write(tmp_path / "mx.toml", '[matrix]\nbackend = "cuda"\n[[model]]\npath = "m.onnx"\n')
    (tmp_path / "m.onnx").write_bytes(b"")
    assert main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run"]) == 2
    assert "mx.toml:2: matrix.backend" in capsys.readouterr().err


def test_adapter_config_with_a_bom_is_read(tmp_path: Path) -> None:
    # old: 'adapter_config.json: not a readable JSON file (Unexpected UTF-8 BOM (decode using utf-8-sig) ...)'
    from safetensors.numpy import save_file

    from trtforge.plugins.lora.pack import load_adapter

    rng = seeded_rng("bom-adapter")
    a, b = rng.standard_normal((4, 16)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    save_file({"base_model.model.q_proj.lora_A.weight": a, "base_model.model.q_proj.lora_B.weight": b},
              str(tmp_path / "adapter_model.safetensors"))
    _write(tmp_path / "adapter_config.json", json.dumps({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}))
    ad = load_adapter(tmp_path)
    assert ad.rank == 4 and ad.scale == 2.0


def test_hf_config_with_a_bom_is_read(cli, tmp_path: Path) -> None:
    # old: kv-plan --model config.json: 'not a readable JSON config (Unexpected UTF-8 BOM ...)' (exit 2)
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "vocab_size": 32000}
    _write(tmp_path / "config.json", json.dumps(cfg))
    res = cli("kv-plan", "--profile", "a100", "--model", tmp_path / "config.json")
    assert res.code == 0, res.err


def test_cache_request_with_a_bom_is_read(cli, tmp_path: Path) -> None:
    # old: 'r.json: not valid JSON (Unexpected UTF-8 BOM ...)' (exit 2)
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    _write(tmp_path / "r.json", json.dumps(req))
    res = cli("cache", "key", tmp_path / "r.json")
    assert res.code == 0, res.err
    assert json.loads(res.out)["cacheable"]
