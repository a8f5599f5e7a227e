"""trtforge triton, round 4: configs whose batching said something else than the engine (real TensorRT-RTX builds
of tiny models built here; configs parsed with tritonclient's ModelConfig)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error


def _adapter_count_model(path: Path) -> Path:
    """y [batch, 8] = x [batch, 8] + sum over a [num_adapters, 8]: two dynamic first dims that are not one batch."""
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["a", "axes"], ["s"], keepdims=1), helper.make_node("Add", ["x", "s"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
              helper.make_tensor_value_info("a", TensorProto.FLOAT, ["num_adapters", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [axes])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_first_dims_of_other_ranges_are_not_one_batch(tmp_path: Path, cli) -> None:
    """An input whose first dim is a --dim dimension (a count of adapters, 1..4) beside the batch (1..16): the
    config said max_batch_size 4 (the adapters' max) with dims [8] for both, so Triton would make a request send as
    many adapter rows as batch rows and refuse batches above 4; now max_batch_size 0 with the full dims, and --check
    refuses the old config."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    src = _adapter_count_model(tmp_path / "m.onnx")
    res = cli("build", src, "--profile", "a100", "-o", tmp_path / "e", "--no-progress", "--dim", "num_adapters=1:2:4")
    assert res.code == 0, res.err
    assert cli("triton", tmp_path / "e", "--repo", tmp_path / "repo", "--name", "m").code == 0
    cfg_path = tmp_path / "repo" / "m" / "config.pbtxt"
    cfg = text_format.Parse(cfg_path.read_text(), model_config_pb2.ModelConfig())
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    assert {t.name: list(t.dims) for t in cfg.input} == {"x": [-1, 8], "a": [-1, 8]}
    assert [list(t.dims) for t in cfg.output] == [[-1, 8]]
    assert cli("triton", "--check", tmp_path / "repo" / "m").code == 0

    # what the old code wrote is refused by --check, and --max-batch cannot ask for it
    cfg.max_batch_size = 4
    for t in [*cfg.input, *cfg.output]:
        del t.dims[0]
    cfg_path.write_text(text_format.MessageToString(cfg))
    assert_one_line_error(cli("triton", "--check", tmp_path / "repo" / "m"), 1, "max_batch_size 4",
                          "shared by every input")
    res = cli("triton", tmp_path / "e", "--repo", tmp_path / "repo2", "--name", "m", "--max-batch", "4")
    assert_one_line_error(res, 2, "--max-batch 4", "shared by every input")


def test_write_names_sibling_folders_that_stop_tritonserver(tmp_path: Path, cli) -> None:
    """An engine folder inside the repository (triton REPO/e --repo REPO --name m) and a .ipynb_checkpoints folder
    make tritonserver fail to load the whole repository; the write exited 0 without a word and only --check said
    so. Now the write still succeeds (its entry is valid) and warns once per such folder, naming the fix."""
    src = _adapter_count_model(tmp_path / "m.onnx")
    repo = tmp_path / "repo"
    repo.mkdir()
    res = cli("build", src, "--profile", "a100", "-o", repo / "e", "--no-progress", "--dim", "num_adapters=1:2:4")
    assert res.code == 0, res.err
    (repo / ".ipynb_checkpoints").mkdir()
    res = cli("triton", repo / "e", "--repo", repo, "--name", "m", "-q")
    assert res.code == 0, res.err
    warnings = [ln for ln in res.err.splitlines() if ln.startswith("warning: ")]
    assert len(warnings) == 2, res.err
    assert f"{repo / '.ipynb_checkpoints'}: hidden folder" in warnings[0]
    assert f"{repo / 'e'}: no config.pbtxt" in warnings[1]
    assert cli("triton", "--check", repo / "m").code == 1  # what --check says of the same repository
    clean = cli("triton", repo / "e", "--repo", tmp_path / "clean", "--name", "m", "-q")
    assert (clean.code, clean.err) == (0, "")


def test_check_hashes_every_version_the_policy_serves(tmp_path: Path, cli) -> None:
    """--check compared only the latest version's plan with its manifest, though version_policy all / specific /
    latest { num_versions: 2 } makes tritonserver load older versions too; a corrupted version 1 passed. Now every
    served version with a manifest is hashed, and a version the policy does not serve is not judged."""
    src = _adapter_count_model(tmp_path / "m.onnx")
    res = cli("build", src, "--profile", "a10", "-o", tmp_path / "e", "--no-progress", "--dim", "num_adapters=1:2:4")
    assert res.code == 0, res.err
    res = cli("triton", tmp_path / "e", "--repo", tmp_path / "repo", "--name", "m", "--version", "2")
    assert res.code == 0, res.err
    entry = tmp_path / "repo" / "m"
    shutil.copytree(entry / "2", entry / "1")  # an older version kept beside it (writes replace a whole entry)
    assert sorted(p.name for p in entry.iterdir() if p.is_dir() and p.name.isdigit()) == ["1", "2"]
    with open(entry / "1" / "model.plan", "ab") as fh:  # version 1's plan no longer matches its manifest
        fh.write(b"\0")
    assert cli("triton", "--check", entry).code == 0  # default policy: latest 1, so version 2 only
    cfg = entry / "config.pbtxt"
    text = cfg.read_text()
    for policy in ("version_policy { all { } }", "version_policy { specific { versions: [1, 2] } }",
                   "version_policy { latest { num_versions: 2 } }"):
        cfg.write_text(text + "\n" + policy + "\n")
        assert_one_line_error(cli("triton", "--check", entry), 1, "1/model.plan", "sha256 differs")
    cfg.write_text(text + "\nversion_policy { specific { versions: [2] } }\n")
    assert cli("triton", "--check", entry).code == 0
