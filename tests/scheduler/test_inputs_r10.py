"""kv-plan configs and simulate traces, held-out QA round 10: values read wrong without a word are refused (exit 2,
one line naming the file and the key): a string ``tie_word_embeddings`` ("false" was read as tied), a key given
twice (the last won), hidden_size not a multiple of the heads (head_dim floored), ``num_local_experts`` 0 (read
as 1), a non-integer ``sliding_window`` (its lower-bound warning was dropped); an impossible UTC offset; a JSON
string where a trace needs a number; a far timestamp blamed on the trace, not on flags left at their defaults; and a
missing key names the file once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtforge_testing import assert_one_line_error

BASE = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512,
        "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 4096, "model_type": "llama"}


@pytest.mark.parametrize(("text", "needles"), [
    (json.dumps(BASE | {"tie_word_embeddings": "false"}), ("tie_word_embeddings", "true or false", "'false'")),
    (json.dumps(BASE)[:-1] + ', "num_hidden_layers": 8}', ("num_hidden_layers", "given twice")),
    (json.dumps(BASE | {"num_attention_heads": 6}), ("not a multiple of num_attention_heads 6", "head_dim")),
    (json.dumps(BASE | {"num_local_experts": 0}), ("num_local_experts", "got 0")),
    (json.dumps(BASE | {"sliding_window": "2048"}), ("sliding_window", "'2048'")),
    (json.dumps(BASE | {"sliding_window": 2048.0}), ("sliding_window", "2048.0")),
])
def test_config_values_read_wrong_are_refused(tmp_path: Path, cli, text: str, needles: tuple[str, ...]) -> None:
    p = tmp_path / "config.json"
    p.write_text(text)
    res = cli("kv-plan", "--profile", "a100", "--model", p)
    assert_one_line_error(res, 2, str(p), *needles)
    assert res.err.count(str(p)) == 1


@pytest.mark.parametrize("drop", ["num_hidden_layers", "vocab_size"])
def test_a_missing_key_names_the_file_once(tmp_path: Path, cli, drop: str) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({k: v for k, v in BASE.items() if k != drop}))
    res = cli("kv-plan", "--profile", "a100", "--model", p)
    assert_one_line_error(res, 2, f"missing key {drop!r}")
    assert res.err.count(str(p)) == 1, res.err


def test_the_values_that_stay_valid_still_plan(tmp_path: Path, cli) -> None:
    """The refusals above are of malformed values only: true/false, null, an integer window, explicit head_dim."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(BASE | {"tie_word_embeddings": True, "sliding_window": None, "num_local_experts": None,
                                    "num_attention_heads": 6, "head_dim": 64}))
    assert cli("kv-plan", "--profile", "a100", "--model", p).code == 0
    p.write_text(json.dumps(BASE | {"sliding_window": 1024}))
    res = cli("kv-plan", "--profile", "a100", "--model", p)
    assert res.code == 0 and "sliding_window 1024" in res.err


@pytest.mark.parametrize(("name", "text", "needles"), [
    ("tz.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+99:99,10,5\n2024-05-10 00:00:01,10,5\n",
     ("tz.csv:2", "+99:99")),
    ("tz24.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00-24:00,10,5\n", ("tz24.csv:2",)),
    ("len.jsonl", '{"timestamp": 0, "input_length": "1000", "output_length": 5}\n', ("len.jsonl:1", "input_length")),
    ("out.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": "5"}\n', ("out.jsonl:1", "output_length")),
    ("dup.jsonl", '{"timestamp": 0, "input_length": 10, "input_length": 20, "output_length": 5}\n',
     ("dup.jsonl:1", "'input_length' is given twice")),
    ("far.jsonl", '{"timestamp": 1e300, "input_length": 10, "output_length": 5}\n'
                  '{"timestamp": 0, "input_length": 10, "output_length": 5}\n', ("far.jsonl", "timestamps")),
])
def test_trace_values_read_wrong_are_refused(tmp_path: Path, cli, name: str, text: str,
                                             needles: tuple[str, ...]) -> None:
    p = tmp_path / name
    p.write_text(text)
    res = cli("simulate", "--trace", p, "--profile", "h100", "--model", "llama-3.1-8b", "--policy", "cache-aware")
    assert_one_line_error(res, 2, *needles)
    assert "--time-scale 1 " not in res.err  # the default flags are not the fault


def test_valid_offsets_still_shift_arrivals(tmp_path: Path) -> None:
    from trtforge.scheduler.sim.traces import read_azure_csv

    p = tmp_path / "ok.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+23:59,10,5\n"
                 "2024-05-10 00:00:00-00:01,10,5\n")
    arrivals = sorted(r.arrival for r in read_azure_csv(p))
    assert arrivals == [0.0, 24 * 3600.0]  # +23:59 is 23 h 59 min before -00:01
