"""Held-out QA (session 25): traces written here in forms the project's tests never used (a byte-order mark,
CRLF line ends, timestamps across a daylight-saving change), replayed through the real readers and simulator."""

from __future__ import annotations

import json
import time

import pytest

from trtforge.scheduler.sim.traces import read_azure_csv, read_mooncake_jsonl

AZURE_ROWS = ["2023-11-16 18:15:46.5,374,44", "2023-11-16 18:15:47.0,10,0", "2023-11-16 18:15:48.25,20,5"]
MOONCAKE_ROWS = [{"timestamp": 0, "input_length": 1000, "output_length": 50, "hash_ids": [1, 2]},
                 {"timestamp": 2500, "input_length": 700, "output_length": 3, "hash_ids": [1, 3]}]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_traces_with_a_byte_order_mark_read_as_without(tmp_path, newline: str) -> None:
    # a spreadsheet's "CSV UTF-8" export starts with a BOM: the CSV header was refused as
    # '\ufeffTIMESTAMP,...' (printed identical to the expected one) and a JSONL's first line as invalid JSON
    csv_text = newline.join(["TIMESTAMP,ContextTokens,GeneratedTokens", *AZURE_ROWS]) + newline
    jsonl_text = newline.join(json.dumps(r) for r in MOONCAKE_ROWS) + newline
    plain_csv, bom_csv = tmp_path / "a.csv", tmp_path / "bom.csv"
    plain_jsonl, bom_jsonl = tmp_path / "m.jsonl", tmp_path / "bom.jsonl"
    plain_csv.write_bytes(csv_text.encode())
    bom_csv.write_bytes(b"\xef\xbb\xbf" + csv_text.encode())
    plain_jsonl.write_bytes(jsonl_text.encode())
    bom_jsonl.write_bytes(b"\xef\xbb\xbf" + jsonl_text.encode())
    az = read_azure_csv(bom_csv)
    assert az == read_azure_csv(plain_csv)
    assert [(r.arrival, r.prompt_tokens, r.max_new_tokens) for r in az] == [(0.0, 374, 44), (0.5, 10, 1),
                                                                            (1.75, 20, 5)]
    mc = read_mooncake_jsonl(bom_jsonl)
    assert mc == read_mooncake_jsonl(plain_jsonl)
    assert [(r.arrival, r.block_hashes) for r in mc] == [(0.0, (1, 2)), (2.5, (1, 3))]


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="needs time.tzset")
@pytest.mark.parametrize("zone", ["America/New_York", "Europe/Berlin", "UTC"])
def test_azure_arrivals_do_not_depend_on_the_machines_time_zone(tmp_path, monkeypatch, zone: str) -> None:
    # timestamps without a zone were read in the machine's local zone: across a DST change (US: 2023-03-12 02:00
    # -> 03:00) 01:59:59 -> 03:00:00 became 1 s apart instead of 3601 s, and results differed by machine
    p = tmp_path / "dst.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-03-12 01:59:59.0,10,5\n"
                 "2023-03-12 03:00:00.0,10,5\n2023-03-26 03:30:00.5,10,5\n")
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        arrivals = [r.arrival for r in read_azure_csv(p)]
    finally:
        monkeypatch.undo()
        time.tzset()
    assert arrivals == [0.0, 3601.0, 14 * 86400 + 5401.5]
