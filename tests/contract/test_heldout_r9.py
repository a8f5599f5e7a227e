"""Held-out CLI checks, round 9: inputs a user can hand over that ended in exit 3 'internal error' (or no end).

- JSON / TOML nested deeper than Python's stack (RecursionError) and a JSON integer of over 4300 digits (int()'s
  limit): a request for ``cache key``, an engine's ``manifest.json`` for ``triton``, a profile, a matrix file.
- ``quantize --calib-size 10**8`` grew to gigabytes and never ended; ``--calib-seq 10**9`` was a MemoryError.
- A symbolic link loop given to ``build-matrix`` (pathlib's ``RuntimeError('Symlink loop ...')``).
- ``lora inject --tile 0`` wrote tile 128 (0 read as 'not given') and exit 0; ``--tile 48`` blamed the model file.
- ``triton --check`` of a config with a 100 kB bad line printed a 100 kB error line.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from trtforge.examples.llama import make_llama
from trtforge_testing import assert_one_line_error

from .fixtures import tiny_model

DEEP_JSON = "[" * 200_000 + "]" * 200_000
DEEP_TOML = "a = " + "[" * 100_000 + "]" * 100_000 + "\n"
DEEP_TABLE = "a = " + "{b=" * 5000 + "1" + "}" * 5000 + "\n"


def test_deep_or_huge_json_is_exit_2(cli, tmp_path: Path) -> None:
    req = tmp_path / "req.json"
    req.write_text(DEEP_JSON)
    assert_one_line_error(cli("cache", "key", req), 2, str(req), "nested too deeply")
    for name, text, why in (("deep", DEEP_JSON, "nested too deeply"),
                            ("big", '{"format": ' + "9" * 5000 + "}", "more than 4300 digits")):
        eng = tmp_path / f"eng_{name}"
        eng.mkdir()
        (eng / "manifest.json").write_text(text)
        res = cli("triton", eng, "--repo", tmp_path / "repo", "--name", "m")
        assert_one_line_error(res, 2, str(eng / "manifest.json"), why)
        assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("text", [DEEP_TOML, DEEP_TABLE], ids=["array", "table"])
def test_deep_toml_is_exit_2(cli, tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(text)
    for argv in (["profiles", path], ["kv-plan", "--profile", path, "--model", "llama-3.1-8b"],
                 ["build-matrix", path, "-o", tmp_path / "out"]):
        assert_one_line_error(cli(*argv), 2, str(path), "nested too deeply")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flags", "needle"), [
    (["--calib-size", "100000000"], "--calib-size 100000000: give a whole number from 1 to 4096"),
    (["--calib-size", "99999999999999999999"], "from 1 to 4096"),
    (["--calib-seq", "1000000000"], "--calib-seq 1000000000: give a whole number from 1 to 131072"),
    (["--calib-size", "4096", "--calib-seq", "4096"], "at most 1,048,576 generated tokens"),
])
def test_calibration_sizes_are_bounded(cli, tmp_path: Path, flags: list[str], needle: str) -> None:
    src = tiny_model(tmp_path / "m.onnx")
    res = cli("quantize", src, "-o", tmp_path / "q.onnx", "--mode", "int8", *flags)
    assert_one_line_error(res, 2, needle)
    assert not (tmp_path / "q.onnx").exists()


def test_a_symlink_loop_given_to_build_matrix_is_exit_2(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    os.symlink("L", "L")
    tiny_model(tmp_path / "m.onnx")
    Path("m1.toml").write_text('[[model]]\nname = "m"\npath = "L"\nprofiles = ["a100"]\n')
    Path("ok.toml").write_text('[[model]]\nname = "m"\npath = "m.onnx"\nprofiles = ["a100"]\n')
    for argv in (["L", "-o", "out"], ["m1.toml", "-o", "out"], ["ok.toml", "-o", "L/sub"]):
        assert_one_line_error(cli("build-matrix", *argv), 2, "too many levels of symbolic links")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["L", "m.onnx", "m1.toml", "ok.toml"]


@pytest.mark.parametrize("tile", ["0", "48", "-32"])
def test_lora_inject_refuses_a_tile_it_has_not(cli, tmp_path: Path, tile: str) -> None:
    src = tmp_path / "llama.onnx"
    onnx.save(make_llama(), src)
    res = cli("lora", "inject", src, "-o", tmp_path / "o.onnx", "--targets", "v_proj", "--tile", tile)
    assert_one_line_error(res, 2, f"--tile {tile}", "32, 64, 128, 256")
    assert not (tmp_path / "o.onnx").exists()


def test_triton_check_shortens_a_long_bad_line(cli, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    eng, repo = tmp_path / "eng", tmp_path / "repo"
    assert cli("build", tiny_model(tmp_path / "m.onnx"), "--profile", "a100", "-o", eng, "--no-progress").code == 0
    assert cli("triton", eng, "--repo", repo, "--name", "m", "--no-warmup").code == 0
    with open(repo / "m" / "config.pbtxt", "a", encoding="utf-8") as fh:
        fh.write('parameters { key: "a" value: ' + "{" * 50_000 + "}" * 50_000 + "}\n")
    res = cli("triton", "--check", repo / "m")
    assert res.code == 1 and "config.pbtxt" in res.err and "Traceback" not in res.err, res.err
    assert len(res.err) < 1000, len(res.err)


@pytest.mark.parametrize("edit", ["shape-tensor", "no-output"])
def test_triton_check_catches_configs_tritonserver_refuses(cli, tmp_path: Path, edit: str) -> None:
    """An input marked ``is_shape_tensor`` (tritonserver's TensorRT backend: "incorrectly specified as a shape
    tensor") and a config without the engine's output passed ``triton --check``."""
    pytest.importorskip("tensorrt_rtx")
    eng, repo = tmp_path / "eng", tmp_path / "repo"
    assert cli("build", tiny_model(tmp_path / "m.onnx"), "--profile", "a100", "-o", eng, "--no-progress").code == 0
    assert cli("triton", eng, "--repo", repo, "--name", "m", "--no-warmup").code == 0
    cfg = repo / "m" / "config.pbtxt"
    text = cfg.read_text()
    if edit == "shape-tensor":
        i = text.index("input {")
        j = text.index("}", i)
        text = text[:j] + "  is_shape_tensor: true\n" + text[j:]
        needle = "is_shape_tensor"
    else:
        i = text.index("output {")
        text = text[:i] + text[text.index("}\n", i) + 2:]
        needle = "missing from the config"
    cfg.write_text(text)
    res = cli("triton", "--check", repo / "m")
    assert res.code == 1 and needle in res.err, res.err
