"""build-matrix cache keys (held-out QA): they change with every input of the engine (model and external-data bytes,
profile content, pipeline, backend version) and with nothing else (paths, file names, profile labels, mtimes).
Planning only (no build): each case runs in milliseconds."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.matrix import cells
from trtforge.build_engine.matrix.spec import load_matrix

PROFILES = Path(cells.__file__).resolve().parents[2] / "profiles"


def _model(folder: Path, name: str, w: np.ndarray, external: bool) -> None:
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", w.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", w.shape[1]])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / name, save_as_external_data=external, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)


def _setup(folder: Path, w: np.ndarray, *, model: str = "m.onnx", profile: str = "p.toml",
           profile_text: str | None = None, external: bool = False, pipeline: str = "") -> str:
    """The one cell's key of a matrix in ``folder`` (created fresh)."""
    shutil.rmtree(folder, ignore_errors=True)
    _model(folder, model, w, external)
    (folder / profile).write_text(profile_text if profile_text is not None else (PROFILES / "a100.toml").read_text())
    (folder / "mx.toml").write_text(f'[matrix]\nprofiles = ["{profile}"]\nbackend = "tensorrt-rtx"\n'
                                    f'[[model]]\npath = "{model}"\nname = "m"\n{pipeline}')
    (cell,) = cells.plan_cells(load_matrix(folder / "mx.toml"))
    return cell.key


def test_key_ignores_paths_names_labels_and_mtimes(tmp_path: Path, rng: np.random.Generator) -> None:
    w = rng.standard_normal((32, 24)).astype(np.float32)
    a100 = (PROFILES / "a100.toml").read_text()
    for external in (False, True):
        base = _setup(tmp_path / "a", w, external=external)
        assert base == _setup(tmp_path / "elsewhere" / "deeper", w, external=external)
        assert base == _setup(tmp_path / "b", w, model="renamed.onnx", external=external)
        assert base == _setup(tmp_path / "c", w, profile="other.toml", external=external)
        assert base == _setup(tmp_path / "d", w, external=external,
                              profile_text=a100.replace('name = "a100"', 'name = "a100x"', 1)
                              .replace('description = "', 'description = "relabelled ', 1) + "\n# comment\n")
        os.utime(tmp_path / "a" / "m.onnx", (12345, 12345))
        assert base == cells.plan_cells(load_matrix(tmp_path / "a" / "mx.toml"))[0].key


def test_key_changes_with_every_input_of_the_engine(tmp_path: Path, rng: np.random.Generator,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    w = rng.standard_normal((32, 24)).astype(np.float32)
    a100 = (PROFILES / "a100.toml").read_text()
    base = _setup(tmp_path / "a", w)
    w2 = w.copy()
    w2[rng.integers(32), rng.integers(24)] += 0.5
    keys = {base, _setup(tmp_path / "b", w2),
            _setup(tmp_path / "c", w, profile_text=a100.replace("optimization_level = 3", "optimization_level = 2")),
            _setup(tmp_path / "d", w, profile_text=a100.replace("max = 1024", "max = 2048")),
            _setup(tmp_path / "e", w, pipeline='[model.pipeline]\nprecision = "fp16"\n'),
            _setup(tmp_path / "f", w, pipeline="[model.pipeline]\nfold = false\n")}
    assert len(keys) == 6
    ext = _setup(tmp_path / "g", w, external=True)
    data = bytearray((tmp_path / "g" / "weights.bin").read_bytes())
    data[rng.integers(len(data))] ^= 0x10
    (tmp_path / "g" / "weights.bin").write_bytes(bytes(data))
    assert cells.plan_cells(load_matrix(tmp_path / "g" / "mx.toml"))[0].key != ext
    monkeypatch.setattr(cells, "backend_version", lambda module: "99.0.0")
    assert cells.plan_cells(load_matrix(tmp_path / "a" / "mx.toml"))[0].key != base


def test_object_store_keeps_external_data_in_its_subfolder(tmp_path: Path, rng: np.random.Generator) -> None:
    """Ray without a shared filesystem ships the model's files by name: external data in a subfolder (location
    "data/weights.bin") must arrive there (it was flattened to "weights.bin", so every Ray cell of such a model failed
    while the local executor built it)."""
    from trtforge.build_engine.core.onnx_io import load_model
    from trtforge.build_engine.matrix.driver import CellStatus, _sources
    from trtforge.build_engine.matrix.worker import CellJob, _source

    w = rng.standard_normal((32, 24)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 24])],
                              [numpy_helper.from_array(w, "w")])
    (tmp_path / "src" / "data").mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "src" / "m.onnx",
              save_as_external_data=True, location="data/weights.bin", size_threshold=0)
    (tmp_path / "src" / "a100.toml").write_text((PROFILES / "a100.toml").read_text())
    (tmp_path / "src" / "mx.toml").write_text('[matrix]\nprofiles = ["a100.toml"]\nbackend = "tensorrt-rtx"\n'
                                              '[[model]]\npath = "m.onnx"\nname = "m"\n')
    spec = load_matrix(tmp_path / "src" / "mx.toml")
    (cell,) = cells.plan_cells(spec)
    files = _sources(spec, [CellStatus(cell)], "ray")["m"]
    assert files is not None and sorted(files) == ["data/weights.bin", "m.onnx"]
    job = CellJob(label=cell.label, model_name="m.onnx", source_path=None, source_files=files,
                  pipeline=cell.model.pipeline, profile=cell.profile, backend=cell.backend, staging=None)
    (tmp_path / "work").mkdir()
    got = load_model(_source(job, tmp_path / "work"))
    np.testing.assert_array_equal(numpy_helper.to_array(got.graph.initializer[0]), w)
