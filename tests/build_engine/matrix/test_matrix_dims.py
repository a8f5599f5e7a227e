"""build-matrix ``dims`` (``build --dim`` per model): the cell builds with the range (a real TensorRT-RTX build), the
cache key changes with the ranges and not otherwise, and a malformed entry exits 2 naming the line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trtforge.build_engine.cli import main
from trtforge.build_engine.matrix import cells
from trtforge.build_engine.matrix.spec import load_matrix
from trtforge_testing import assert_one_line_error

pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds the engines (pip install 'trtforge[rtx]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_build_dims import _patches  # noqa: E402


def _matrix(root: Path, dims: str) -> Path:
    path = root / "mx.toml"
    path.write_text(f'[matrix]\nprofiles = ["a10"]\n\n[[model]]\npath = "p.onnx"\nname = "p"\n{dims}\n')
    return path


def test_matrix_dims_build_and_key(tmp_path: Path) -> None:
    _patches(tmp_path / "p.onnx")
    out = tmp_path / "out"
    assert main(["build-matrix", str(_matrix(tmp_path, 'dims = { patches = "2:8:32" }')), "-o", str(out)]) == 0
    manifest = json.loads((out / "p" / "a10" / "manifest.json").read_text())
    x = next(t for t in manifest["inputs"] if t["name"] == "x")
    assert {(tuple(r["min"][1:2]), tuple(r["opt"][1:2]), tuple(r["max"][1:2])) for r in x["profiles"]} == {
        ((2,), (8,), (32,))}
    key = cells.plan_cells(load_matrix(tmp_path / "mx.toml"))[0].key
    other = cells.plan_cells(load_matrix(_matrix(tmp_path, 'dims = { patches = "2:8:64" }')))[0].key
    assert key != other
    (cell,) = cells.plan_cells(load_matrix(_matrix(tmp_path, "")))
    assert "dims" not in cell.model.pipeline.to_json()  # matrices without dims keep their earlier keys


@pytest.mark.parametrize(("dims", "why"), [('dims = { patches = "8:2:32" }', "MIN <= OPT <= MAX"),
                                           ('dims = { patches = 5 }', "MIN:OPT:MAX"),
                                           ('dims = "patches=1:2:3"', "MIN:OPT:MAX"),
                                           # model-independent: refused at load (was planned, then every cell failed)
                                           ('dims = { batch = "1:2:3" }', "profile's [[shapes]]"),
                                           ('dims = { Seq_Len = "1:2:3" }', "profile's [[shapes]]")])
def test_matrix_bad_dims_exit_2(tmp_path: Path, dims: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trtforge_testing import CliResult

    _patches(tmp_path / "p.onnx")
    code = main(["build-matrix", str(_matrix(tmp_path, dims)), "-o", str(tmp_path / "out")])
    cap = capsys.readouterr()
    assert_one_line_error(CliResult(code, cap.out, cap.err), 2, "mx.toml:", "dims", why)
    assert not (tmp_path / "out").exists()
