"""A model whose external data file has more than one hard link (``cp -al``, ``ln``, a deduplicating store) is read
like any other: onnx's reader refuses such a file ("potential hardlink attack"), so the same model was accepted when
its weights were big (read by trtforge from disk), refused (exit 2) when they were small, and ``fold --check`` on the
big one was an internal error (exit 3). The outputs equal those of the same model with a one-link data file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.cli import main
from trtforge_testing import seeded_rng


def _model(folder: Path, label: str, side: int) -> Path:
    """Two MatMuls with external weights of ``side`` x ``side`` float32 (512: 1 MiB each, left on disk by a lazy
    load; 32: read into memory), behind Identity nodes that fold removes."""
    rng = seeded_rng(label)
    folder.mkdir()
    inits = [numpy_helper.from_array(rng.standard_normal((side, side)).astype(np.float32), f"w{i}") for i in (0, 1)]
    nodes = [helper.make_node("Identity", ["x"], ["x0"]), helper.make_node("MatMul", ["x0", "w0"], ["h"]),
             helper.make_node("Identity", ["h"], ["h0"]), helper.make_node("MatMul", ["h0", "w1"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", side])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", side])], inits)
    path = folder / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path, save_as_external_data=True,
              all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    return path


def _weights(path: Path) -> dict[str, np.ndarray]:
    from trtforge.build_engine.core.onnx_io import load

    model = load(path).model  # trtforge's own loader: onnx.load would refuse a hard-linked output data file too
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("side", [32, 512])
@pytest.mark.parametrize("argv", [["fold"], ["fold", "--check"], ["precision", "--to", "fp16"]])
def test_hard_linked_external_data_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str], side: int,
                                           argv: list[str]) -> None:
    plain = _model(tmp_path / "plain", f"hardlinks-{side}", side)
    linked_dir = tmp_path / "linked"
    shutil.copytree(plain.parent, linked_dir)
    os.link(linked_dir / "m.onnx.data", tmp_path / "another-name.data")
    assert os.stat(linked_dir / "m.onnx.data").st_nlink == 2
    outs = []
    for src in (plain, linked_dir / "m.onnx"):
        out = src.parent / "out.onnx"
        rc = main([argv[0], str(src), "-o", str(out), *argv[1:]])
        err = capsys.readouterr().err
        assert rc == 0, err
        outs.append(_weights(out))
    assert outs[0].keys() == outs[1].keys() and len(outs[0]) == 2  # w0, w1 (w0__fp16, w1__fp16 after precision)
    for name in outs[0]:
        np.testing.assert_array_equal(outs[0][name], outs[1][name])
    assert os.stat(linked_dir / "m.onnx.data").st_nlink == 2  # the input's data file is left as it was
