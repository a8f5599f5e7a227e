"""Names from the user's files print as written: rich markup in a path, a value name or an op type is never parsed.

A valid ONNX model may name an output ``[/x]`` and a file may be called ``a[red].onnx``; rich would take both for
markup (the first raises MarkupError, the second is swallowed as a style), so the CLI escapes every such string.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import run_console, seeded_rng


def _bracket_model(rng: np.random.Generator) -> onnx.ModelProto:
    """in[bold] -> Cast(fp32->fp32 no-op) -> Mul by a random weight -> '[/x]'; the Cast is what fold removes."""
    w = numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "w[i]")
    nodes = [helper.make_node("Cast", ["in[bold]"], ["c[dim]"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["c[dim]", "w[i]"], ["[/x]"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("in[bold]", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("[/x]", TensorProto.FLOAT, [2, 3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_diff_prints_bracketed_names_verbatim(tmp_path: Path, cli) -> None:
    a, b = tmp_path / "a[red].onnx", tmp_path / "b.onnx"
    onnx.save(_bracket_model(seeded_rng("markup-diff")), a)
    b.write_bytes(a.read_bytes())
    res = cli("diff", a, b)
    assert res.code == 0, res.err
    assert "[/x]" in res.out and "a[red].onnx" in res.out, res.out
    assert "outputs match" in res.out


def test_fold_summary_prints_the_output_path_verbatim(tmp_path: Path, cli) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "o[bold].onnx"
    onnx.save(_bracket_model(seeded_rng("markup-fold")), src)
    res = cli("fold", src, "-o", out)
    assert res.code == 0, res.err
    assert str(out) in res.out, res.out
    assert "Cast 1" in res.out, res.out
    assert out.is_file()


def test_backends_install_hint_keeps_the_extra(tmp_path: Path) -> None:
    """With no backend importable the hint must read pip install 'trtforge[rtx]', not pip install 'trtforge'."""
    shim = tmp_path / "shim"
    for name in ("tensorrt_rtx", "tensorrt"):  # shadow both so this runs the same with or without them installed
        (shim / name).mkdir(parents=True)
        (shim / name / "__init__.py").write_text(f"raise ImportError('{name} hidden by this test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), *sys.path])}
    res = run_console(["backends"], env=env)
    assert res.code == 0, res.err
    assert "no TensorRT backend found" in res.out, res.out
    assert "trtforge[rtx]" in res.out, res.out
