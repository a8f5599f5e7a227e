"""Round-4 QA regressions for build-matrix (no engine is built: the checks run before any build)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.cli import main
from trtforge_testing import REPO


def _model(path: Path, rng: np.random.Generator) -> None:
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_two_cells_with_one_triton_entry_name_are_refused(tmp_path: Path, rng: np.random.Generator,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # old: model m_a10 x a100 and model m x a profile named a10_a100 both wrote REPO/m_a10_a100 (the second replaced
    # the first), and both cells were reported built; now the matrix is refused before anything is built
    _model(tmp_path / "m.onnx", rng)
    text = (REPO / "profiles" / "a100.toml").read_text()
    (tmp_path / "p.toml").write_text(text.replace('name = "a100"', 'name = "a10_a100"'))
    (tmp_path / "mx.toml").write_text('[[model]]\npath = "m.onnx"\nname = "m_a10"\nprofiles = ["a100"]\n'
                                      '[[model]]\npath = "m.onnx"\nname = "m"\nprofiles = ["p.toml"]\n'
                                      '[triton]\nrepo = "repo"\n')
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "m_a10/a100" in err and "m/a10_a100" in err and "'m_a10_a100'" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "repo").exists()


def test_table_prints_profile_names_and_reasons_literally(tmp_path: Path, rng: np.random.Generator,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # old: the table read each cell as rich markup: the unknown profile "[/]" raised MarkupError (exit 3, "internal
    # error", no table) and "[bold]x" was printed as a bold "x"; now both are printed as given and the run exits 1
    monkeypatch.setenv("COLUMNS", "400")
    _model(tmp_path / "m.onnx", rng)
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["[bold]x", "[/]"]\n[[model]]\npath = "m.onnx"\n')
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run"])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "unknown profile '[bold]x'" in captured.out and "[/] not found" in captured.out


def test_lora_max_rank_beyond_the_plugin_is_refused_at_load(tmp_path: Path, rng: np.random.Generator,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # old: max_rank up to 1024 passed the matrix's validation (dry run exit 0), then every cell failed in the worker
    # (lora inject allows 1..64); now the matrix file is refused with its line, exit 2
    _model(tmp_path / "m.onnx", rng)
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "m.onnx"\n'
                                      '[model.pipeline]\nlora = { targets = ["w"], max_rank = 65 }\n')
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "mx.toml:6: pipeline.lora.max_rank: must be an integer from 1 to 64 (got 65)" in err
