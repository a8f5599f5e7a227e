"""A second signal while an interrupted command cleans up (Ctrl-C pressed twice, or a SIGTERM after a Ctrl-C) must
not stop the clean-up half-way: the staging folder beside the output and its lock files go all the same, and the
command still exits 130 / 143 with one line.

The first signal comes from the ``TRTFORGE_TEST_KILL_AT`` hook at a commit step; the second is sent by the process
to itself when the clean-up starts removing the staging folder (``shutil.rmtree`` wrapped so that the signal lands
exactly there, where a repeated Ctrl-C lands by chance on a large output)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.cli import main
from trtforge.build_engine.core import staging
from trtforge_testing import seeded_rng


def _external_model(path: Path, label: str) -> Path:
    rng = seeded_rng(label)
    w = numpy_helper.from_array(rng.standard_normal((32, 16)).astype("float32"), "w")
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("MatMul", ["xi", "w"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path, save_as_external_data=True,
              all_tensors_to_one_file=True, location=f"{path.name}.data", size_threshold=0)
    return path


def _adapter(folder: Path, label: str) -> None:
    from safetensors.numpy import save_file

    rng = seeded_rng(label)
    folder.mkdir()
    q0 = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file({f"{q0}.lora_A.weight": rng.standard_normal((4, 32)).astype("float32"),
               f"{q0}.lora_B.weight": rng.standard_normal((16, 4)).astype("float32")},
              str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8.0, "peft_type": "LORA",
                                                            "target_modules": ["q_proj"]}))


def _signal_when_removing(second: int) -> Callable[..., Any]:
    real = shutil.rmtree
    sent: list[bool] = []

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        if not sent and staging.STAGING in os.fspath(path):
            sent.append(True)
            os.kill(os.getpid(), second)  # handled at the next bytecode: inside the clean-up
        real(path, *args, **kwargs)
    return rmtree


@pytest.mark.parametrize(("argv", "point"), [
    (["fold", "IN", "-o", "OUT", "--report", "REPORT"], "model:staged:SIGINT"),
    (["precision", "IN", "-o", "OUT", "--to", "fp16", "--report", "REPORT"], "model:staged:SIGTERM"),
    (["lora", "pack", "ADAPTER", "--targets", "q_proj", "-o", "POOL"], "file:staged:SIGINT"),
])
@pytest.mark.parametrize(("second", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_second_signal_during_cleanup_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], argv: list[str],
                                                      point: str, second: int, code: int) -> None:
    src = _external_model(tmp_path / "in.onnx", f"cleanup-{point}-{second}")
    out = tmp_path / "out"
    out.mkdir()
    _adapter(tmp_path / "ad", f"cleanup-{point}-{second}")
    subs = {"IN": str(src), "OUT": str(out / "m.onnx"), "REPORT": str(out / "r.json"), "ADAPTER": str(tmp_path / "ad"),
            "POOL": str(out / "pool.safetensors")}
    monkeypatch.setenv(staging.KILL_AT_ENV, point)
    monkeypatch.setattr(staging.shutil, "rmtree", _signal_when_removing(second))
    rc = main([subs.get(a, a) for a in argv])
    err = capsys.readouterr().err
    assert rc == code, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        f"error: interrupted by {signal.Signals(second).name}; no partial output was left"]
    assert sorted(p.name for p in out.iterdir()) == [], "the staging folder (or an output) was left"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ad", "in.onnx", "in.onnx.data", "out"]
