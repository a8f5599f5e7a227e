"""Interrupted runs: kill -9, SIGINT and SIGTERM at each commit step of build, fold (external data) and lora pack.

The signal is sent by the process to itself when it reaches a named step (the ``TRTFORGE_TEST_KILL_AT`` test hook
of ``build_engine/core/staging.py``; ``build:step`` is inside TensorRT's build). The rule: every output is all-old or
all-new (never missing, mixed or half-written), a killed run's leftovers are removed by the next run writing there,
SIGINT exits 130 and SIGTERM 143 with one line, and a signal that arrives once the commit has started lets it finish.
Triton entries are covered with the real server in tests/build_engine/triton_server.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from trtforge_testing import assert_one_line_error, run_console

STAGING = ".trtforge-staging"


def _run(*argv: object, point: str | None = None, no_exchange: bool = False):
    env = dict(os.environ)
    env.pop("TRTFORGE_TEST_KILL_AT", None)
    if point:
        env["TRTFORGE_TEST_KILL_AT"] = point
    if no_exchange:
        env["TRTFORGE_TEST_NO_EXCHANGE"] = "1"
    return run_console([str(a) for a in argv], env=env, timeout=300)


def _expect_exit(res, point: str | None) -> None:
    sig = point.rpartition(":")[2] if point and ":SIG" in point else "SIGKILL"
    if sig == "SIGKILL":
        assert res.code == -9, (res.code, res.err)
    else:
        assert_one_line_error(res, {"SIGINT": 130, "SIGTERM": 143}[sig], f"interrupted by {sig}")


def _weights(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))  # loads the external data the model file names
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------------------- fold
_FOLD = [  # (point, expected output afterwards)
    ("model:staged", "old"), ("model:before-data-rename", "old"), ("model:data-renamed", "old"),
    ("model:committed", "new"), ("model:staged:SIGINT", "old"), ("model:staged:SIGTERM", "old"),
    ("model:data-renamed:SIGINT", "new"),  # the commit had started: it completes, then exit 130
]


def _external_llama(path: Path, seed: int) -> None:
    from trtforge.examples.llama import LlamaConfig, make_llama

    model = make_llama(LlamaConfig(layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                                   vocab=128), seed=seed)
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{path.name}.data", size_threshold=0)


def test_fold_external_data_interrupted(tmp_path: Path) -> None:
    old_src, new_src = tmp_path / "old.onnx", tmp_path / "new.onnx"
    _external_llama(old_src, 1)
    _external_llama(new_src, 2)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    assert _run("fold", new_src, "-o", tmp_path / "new_folded.onnx").code == 0
    assert _run("fold", old_src, "-o", out).code == 0
    old, new = _weights(out), _weights(tmp_path / "new_folded.onnx")
    assert not _same(old, new)
    for point, want in _FOLD:
        res = _run("fold", new_src, "-o", out, point=point)
        _expect_exit(res, point)
        got = _weights(out)
        assert _same(got, {"old": old, "new": new}[want]), point
        # Never a data file the model does not name, except one the kill left (removed by the next run).
        named = {e.value for t in onnx.load(str(out), load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}
        data = {p.name for p in out.parent.glob("*.data")}
        assert named <= data, point
        mode = {oct(os.stat(out.parent / n).st_mode & 0o777) for n in named}
        assert mode == {oct(os.stat(out).st_mode & 0o777)}, point  # data keeps the model file's permissions
        assert _run("fold", old_src, "-o", out).code == 0  # back to old; cleans what the kill left
        assert _same(_weights(out), old)
        assert sorted(p.name for p in out.parent.iterdir()) == sorted(["model.onnx", *named_of(out)]), point


def named_of(model_path: Path) -> list[str]:
    return sorted({e.value for t in onnx.load(str(model_path), load_external_data=False).graph.initializer
                   for e in t.external_data if e.key == "location"})


# ------------------------------------------------------------------------------------------------------ lora pack
_PACK = [("file:staged", "old"), ("file:before-rename", "old"), ("file:renamed", "new"),
         ("file:staged:SIGINT", "old"), ("file:staged:SIGTERM", "old"), ("file:before-rename:SIGTERM", "new")]


def _adapter(folder: Path, seed: int) -> None:
    from safetensors.numpy import save_file

    g = np.random.default_rng(seed)
    folder.mkdir()
    q0 = "model.layers.0.self_attn.q_proj"
    save_file({f"base_model.model.{q0}.lora_A.weight": g.standard_normal((4, 32)).astype(np.float32),
               f"base_model.model.{q0}.lora_B.weight": g.standard_normal((16, 4)).astype(np.float32)},
              str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8.0, "peft_type": "LORA",
                                                            "target_modules": ["q_proj"]}))


def _pool(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """The pool's slot list and tensors (its bytes are not reproducible: safetensors orders metadata keys freely)."""
    from trtforge.plugins.lora.pack import read_safetensors

    data = path.read_bytes()
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    return header["__metadata__"]["slots"], read_safetensors(path)


def _same_pool(a: tuple[str, dict[str, np.ndarray]], b: tuple[str, dict[str, np.ndarray]]) -> bool:
    return a[0] == b[0] and _same(a[1], b[1])


def test_lora_pack_interrupted(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    _adapter(tmp_path / "a", 1)
    _adapter(tmp_path / "b", 2)
    out = tmp_path / "out" / "pool.safetensors"
    out.parent.mkdir()
    args = ("--targets", "q_proj", "--max-rank", "8", "-o", out)
    assert _run("lora", "pack", tmp_path / "a", *args).code == 0
    old = _pool(out)
    assert _run("lora", "pack", tmp_path / "b", *args).code == 0
    new = _pool(out)
    assert not _same_pool(old, new)
    for point, want in _PACK:
        assert _run("lora", "pack", tmp_path / "a", *args).code == 0
        res = _run("lora", "pack", tmp_path / "b", *args, point=point)
        _expect_exit(res, point)
        assert _same_pool(_pool(out), {"old": old, "new": new}[want]), point
        assert [p.name for p in out.parent.iterdir() if p.name != STAGING] == [out.name], point
        if res.code != -9:  # an interrupt cleans up itself; a kill leaves its staging folder to the next run
            assert not (out.parent / STAGING).exists(), point
    assert _run("lora", "pack", tmp_path / "a", *args).code == 0
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]


# ---------------------------------------------------------------------------------------------------------- build
_BUILD = [  # (point, two-rename fallback, expected OUTDIR afterwards)
    ("dir:before-swap", False, "old"), ("dir:swapped", False, "new"),
    ("dir:between-renames", True, "missing"),  # completed by the next run writing beside it (asserted below)
    ("build:step:SIGINT", False, "old"), ("build:step:SIGTERM", False, "old"),
    ("dir:before-swap:SIGINT", False, "new"),  # the commit had started: it completes, then exit 130
]


def _outdir_state(out: Path, sources: dict[str, str]) -> str:
    """"missing", or which source (by its sha256) the complete, self-consistent OUTDIR was built from."""
    if not out.exists():
        return "missing"
    meta = json.loads((out / "manifest.json").read_bytes())
    assert hashlib.sha256((out / "model.plan").read_bytes()).hexdigest() == meta["plan_sha256"]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.onnx", "model.plan"]
    return next(k for k, sha in sources.items() if sha == meta["onnx_sha256"])


def test_build_interrupted(tmp_path: Path) -> None:
    """Each run builds the other source over OUTDIR (so a completed run needs no rebuild to get back)."""
    pytest.importorskip("tensorrt_rtx")
    from trtforge.examples.llama import LlamaConfig, make_llama

    cfg = LlamaConfig(layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=128)
    sha = {}
    for seed in (1, 2):
        onnx.save(make_llama(cfg, seed=seed), str(tmp_path / f"m{seed}.onnx"))
        sha[f"m{seed}"] = hashlib.sha256((tmp_path / f"m{seed}.onnx").read_bytes()).hexdigest()
    out = tmp_path / "out" / "engine"
    out.parent.mkdir()
    build = ("--profile", "a100", "-o", out, "--force", "--no-progress")
    assert _run("build", tmp_path / "m1.onnx", *build).code == 0
    current = "m1"
    for point, no_exchange, want in _BUILD:
        other = "m2" if current == "m1" else "m1"
        res = _run("build", tmp_path / f"{other}.onnx", *build, point=point, no_exchange=no_exchange)
        _expect_exit(res, point)
        got = _outdir_state(out, sha)
        assert got == {"old": current, "new": other, "missing": "missing"}[want], point
        if want == "missing":  # the next command writing in OUTDIR's folder completes the swap first
            assert _run("fold", tmp_path / "m1.onnx", "-o", out.parent / "x.onnx").code == 0
            assert _outdir_state(out, sha) == other
            (out.parent / "x.onnx").unlink()
        assert [p.name for p in out.parent.iterdir() if p.name != STAGING] == [out.name], point
        if want != "old":
            current = other
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no staging left by the last run
