"""``kill -9`` at random instants of real ``trtforge`` runs (not only at the named commit steps of
test_interrupts.py): afterwards every output is all old or all new (a model file with the weights it names, a
complete engine folder, a whole pool), a report beside a model either describes it or is the old one (which
``pairing.report_matches`` then tells apart), and the next run writing there succeeds and removes what the kill
left. The instants are drawn from a seeded generator over the later part of a measured run, where the writing is.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.core.pairing import report_matches
from trtforge_testing import run_console, seeded_rng

CONSOLE = Path(sys.executable).with_name("trtforge")
STAGING = ".trtforge-staging"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRTFORGE_TEST_")}


def _killed_runs(argv_for: Callable[[str], list[str]], cwd: Path, state: Callable[[], str], label: str,
                 kills: int) -> list[tuple[float, str, str]]:
    """Run ``argv_for(source)`` (source "a" or "b", each run writing the other one than the outputs hold now),
    SIGKILL it at a seeded random instant, and return (delay, source written, state found) for each kill."""
    took = []
    for src in ("b", "a"):
        t0 = time.monotonic()
        assert run_console(argv_for(src), cwd=cwd, env=_env(), timeout=300).code == 0
        took.append(time.monotonic() - t0)
    assert state() == "a"
    rng = seeded_rng(label)
    seen = []
    for _ in range(kills):
        current = state()
        other = "b" if current == "a" else "a"
        delay = float(rng.uniform(0.4, 1.0) * min(took))
        proc = subprocess.Popen([str(CONSOLE), *argv_for(other)], cwd=cwd, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        found = state()  # raises on a mixed or half-written output
        assert found in (current, other), (delay, found)
        seen.append((delay, other, found))
    res = run_console(argv_for("a"), cwd=cwd, env=_env(), timeout=300)  # removes what the kills left
    assert res.code == 0, res.err
    assert state() == "a"
    assert not (cwd / STAGING).exists()
    return seen


def _weights_model(path: Path, label: str) -> None:
    rng = seeded_rng(label)
    nodes, inits, prev = [], [], "x"
    for i in range(6):
        inits.append(numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Identity", [prev], [f"i{i}"]), helper.make_node("MatMul", [f"i{i}", f"w{i}"],
                                                                                    [f"h{i}"])]
        prev = f"h{i}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", 256])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path, save_as_external_data=True,
              all_tensors_to_one_file=True, location=f"{path.name}.data", size_threshold=0)


def _first_weight_sum(path: Path) -> float:
    model = onnx.load(str(path))  # with the external data file the model names: fails if it is missing or short
    return float(sum(numpy_helper.to_array(t).astype(np.float64).sum() for t in model.graph.initializer))


def test_fold_killed_at_random_instants(tmp_path: Path) -> None:
    for name in ("a", "b"):
        _weights_model(tmp_path / f"{name}.onnx", f"kill-anytime-{name}")
    sums = {name: _first_weight_sum(tmp_path / f"{name}.onnx") for name in ("a", "b")}
    work = tmp_path / "work"
    work.mkdir()
    out, report = work / "o.onnx", work / "r.json"
    reports: dict[str, bytes] = {}

    def state() -> str:
        got = _first_weight_sum(out)
        which = next(k for k, v in sums.items() if v == got)  # all old or all new weights, never a mix
        named = {e.value for t in onnx.load(str(out), load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}
        assert len(named) == 1
        data = work / named.pop()
        assert data.stat().st_size == 6 * 256 * 256 * 4  # the whole data file, not a prefix
        if report_matches(report, out):
            reports[which] = report.read_bytes()
        else:  # a kill between the model's rename and the report's: the old report, which says it is not this one
            assert report.read_bytes() in reports.values()
        return which

    seen = _killed_runs(lambda src: ["fold", str(tmp_path / f"{src}.onnx"), "-o", "o.onnx", "--report", "r.json"],
                        work, state, "kill-anytime-fold", kills=8)
    assert len(seen) == 8
    named = {e.value for t in onnx.load(str(out), load_external_data=False).graph.initializer
             for e in t.external_data if e.key == "location"}  # o.onnx.data, or o.onnx.<8 hex>.data when that was
    assert sorted(p.name for p in work.iterdir()) == sorted(["o.onnx", "r.json", *named])  # taken by the old model


def _adapter(folder: Path, label: str) -> None:
    from safetensors.numpy import save_file

    rng = seeded_rng(label)
    folder.mkdir()
    tensors = {}
    for layer in range(8):
        q = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
        tensors[f"{q}.lora_A.weight"] = rng.standard_normal((16, 512)).astype(np.float32)
        tensors[f"{q}.lora_B.weight"] = rng.standard_normal((512, 16)).astype(np.float32)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 16.0, "peft_type": "LORA",
                                                            "target_modules": ["q_proj"]}))


def test_lora_pack_killed_at_random_instants(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from trtforge.plugins.lora.pack import read_safetensors

    for name in ("a", "b"):
        _adapter(tmp_path / name, f"kill-anytime-pack-{name}")
    work = tmp_path / "work"
    work.mkdir()
    pool = work / "pool.safetensors"
    digests: dict[str, str] = {}

    def state() -> str:
        tensors = read_safetensors(pool)  # a half-written pool fails to parse or to match below
        key = hashlib.sha256(b"".join(tensors[k].tobytes() for k in sorted(tensors))).hexdigest()
        return next(k for k, v in digests.items() if v == key)

    def argv(src: str) -> list[str]:
        return ["lora", "pack", str(tmp_path / src), "--targets", "q_proj", "-o", "pool.safetensors"]

    for name in ("a", "b"):
        assert run_console(argv(name), cwd=work, env=_env()).code == 0
        tensors = read_safetensors(pool)
        digests[name] = hashlib.sha256(b"".join(tensors[k].tobytes() for k in sorted(tensors))).hexdigest()
    assert digests["a"] != digests["b"]
    _killed_runs(argv, work, state, "kill-anytime-pack", kills=5)
    assert sorted(p.name for p in work.iterdir()) == ["pool.safetensors"]
