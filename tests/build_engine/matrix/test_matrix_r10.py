"""build-matrix, held-out QA round 10: a NUL character in a matrix file's path, profile or Triton repository
(``"\\u0000"`` in TOML) exits 2 naming the line (``Path.resolve`` raised ValueError: exit 3); the compute
capabilities planned for TensorRT-RTX are the ones it targets (7.5 and 12.1 were refused, and on a cluster asked for a
GPU node with full TensorRT, though ``trtforge build`` builds them on this CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.cli import main
from trtforge.build_engine.engine.backend import RTX_TARGETS
from trtforge.build_engine.matrix import cells
from trtforge.build_engine.matrix.spec import load_matrix
from trtforge_testing import CliResult, assert_one_line_error

PROFILES = Path(__file__).resolve().parents[3] / "profiles"


def _model(root: Path, rng: np.random.Generator) -> None:
    w = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), root / "m.onnx")


@pytest.mark.parametrize(("body", "key"), [
    ('[matrix]\nprofiles = ["a10"]\n[[model]]\npath = "m.onnx\\u0000x"\n', "path"),
    ('[matrix]\nprofiles = ["a10\\u0000.toml"]\n[[model]]\npath = "m.onnx"\n', "matrix.profiles"),
    ('[matrix]\nprofiles = ["a10"]\n[[model]]\npath = "m.onnx"\nprofiles = ["\\u0000"]\n', "profiles"),
    ('[matrix]\nprofiles = ["a10"]\n[[model]]\npath = "m.onnx"\n[triton]\nrepo = "r\\u0000"\n', "triton.repo"),
])
def test_nul_in_a_path_exits_2_naming_the_line(tmp_path: Path, rng: np.random.Generator, body: str, key: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path, rng)
    (tmp_path / "mx.toml").write_text(body)
    out = tmp_path / "out"
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(out), "--dry-run"])
    cap = capsys.readouterr()
    assert_one_line_error(CliResult(code, cap.out, cap.err), 2, "mx.toml:", key, "NUL character")
    assert not out.exists()


def test_rtx_targets_are_what_the_installed_tensorrt_rtx_targets() -> None:
    rtx = pytest.importorskip("tensorrt_rtx", reason="needs tensorrt-rtx (pip install 'trtforge[rtx]')")
    enum = {n[2:] for n in rtx.ComputeCapability.__members__ if n.startswith("SM") and n[2:].isdigit()}
    assert {cc.replace(".", "") for cc in RTX_TARGETS} <= enum  # the rule never plans a target it lacks


@pytest.mark.parametrize("cc", ["7.5", "12.1"])
@pytest.mark.parametrize("backend", ["auto", "tensorrt-rtx"])
def test_every_rtx_target_is_planned_for_tensorrt_rtx(tmp_path: Path, rng: np.random.Generator, cc: str,
                                                     backend: str) -> None:
    _model(tmp_path, rng)
    text = (PROFILES / "a10.toml").read_text()
    assert 'compute_capability = "8.6"' in text
    (tmp_path / "p.toml").write_text(text.replace('compute_capability = "8.6"', f'compute_capability = "{cc}"')
                                     .replace('name = "a10"', 'name = "other"', 1))
    (tmp_path / "mx.toml").write_text(f'[matrix]\nprofiles = ["p.toml"]\nbackend = "{backend}"\n'
                                      '[[model]]\npath = "m.onnx"\n')
    (cell,) = cells.plan_cells(load_matrix(tmp_path / "mx.toml"))
    assert not cell.refusal and cell.backend == "tensorrt_rtx" and cell.resource == cells.RESOURCE_RTX


def test_hopper_with_tensorrt_rtx_is_refused_with_a_fix_that_is_not_circular(tmp_path: Path,
                                                                            rng: np.random.Generator) -> None:
    _model(tmp_path, rng)
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["h100"]\nbackend = "tensorrt-rtx"\n'
                                      '[[model]]\npath = "m.onnx"\n')
    (cell,) = cells.plan_cells(load_matrix(tmp_path / "mx.toml"))
    assert cell.refusal and "12.1" in cell.refusal and 'backend = "tensorrt"' in cell.refusal
    assert cells.resolve_backend("auto", "9.0") == "tensorrt"  # so "auto" does pick it, as the message says
