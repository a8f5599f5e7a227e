"""--kv-dtype for kv-plan and simulate: fp8/int8 KV halve bytes per token; fp8 only where the profile allows it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtforge_testing import assert_one_line_error


def _plan(cli, tmp_path: Path, profile: str, dtype: str) -> dict:
    out = tmp_path / f"{profile}_{dtype}.json"
    res = cli("kv-plan", "--profile", profile, "--model", "llama-3.1-8b", "--kv-dtype", dtype, "--json", out)
    assert res.code == 0, res.err
    return json.loads(out.read_text())


@pytest.mark.parametrize(("profile", "one_byte"), [("a100", "int8"), ("l40s", "fp8"), ("l40s", "int8")])
def test_one_byte_kv_halves_bytes_per_token(cli, tmp_path: Path, profile: str, one_byte: str) -> None:
    wide, narrow = _plan(cli, tmp_path, profile, "bf16"), _plan(cli, tmp_path, profile, one_byte)
    assert narrow["kv_bytes_per_token"] * 2 == wide["kv_bytes_per_token"]
    assert narrow["num_blocks"] in (2 * wide["num_blocks"], 2 * wide["num_blocks"] + 1)


@pytest.mark.parametrize("profile", ["a10", "a100"])
def test_fp8_kv_refused_below_cc_89(cli, profile: str) -> None:
    res = cli("kv-plan", "--profile", profile, "--model", "llama-3.1-8b", "--kv-dtype", "fp8")
    assert_one_line_error(res, 2, f"profile '{profile}'", "fp8")
    res = cli("simulate", "--trace", "synthetic:20", "--profile", profile, "--model", "llama-3.1-8b",
              "--policy", "cache-aware", "--kv-dtype", "fp8")
    assert_one_line_error(res, 2, f"profile '{profile}'")


def test_simulate_takes_kv_dtype(cli, tmp_path: Path) -> None:
    got = {}
    for dtype in ("bf16", "int8"):
        out = tmp_path / f"{dtype}.json"
        res = cli("simulate", "--trace", "synthetic:40", "--profile", "a100", "--model", "llama-3.1-8b",
                  "--policy", "cache-aware", "--kv-dtype", dtype, "--json", out)
        assert res.code == 0, res.err
        got[dtype] = json.loads(out.read_text())
    assert got["int8"]["kv_dtype"] == "int8" and got["bf16"]["kv_dtype"] == "bf16"
    assert got["int8"]["kv_bytes_per_token"] * 2 == got["bf16"]["kv_bytes_per_token"]
    assert got["int8"]["num_blocks_per_replica"] >= 2 * got["bf16"]["num_blocks_per_replica"]
