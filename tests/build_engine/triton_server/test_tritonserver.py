"""Repositories written by ``trtforge triton`` against the real tritonserver 2.51 (CPU build from nvidia-pytriton).

One server run over one repository holding: every config variant ``trtforge triton`` writes, broken configs,
layout mistakes (a leftover hidden folder, a folder without config, a config without version), and entries whose
``trtforge triton --force`` was killed (SIGKILL through the ``TRTFORGE_TEST_KILL_AT`` test hook) at each commit step.
On CPU the server has no TensorRT backend: a config it accepts reaches backend loading and fails with "unable to find
backend library for backend 'tensorrt'"; a config it rejects fails earlier, with another reason or no state.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from tritonserver_testing import SKIP_REASON, run_server, server_dir

from trtforge_testing import run_console

pytest.importorskip("tritonclient.grpc.model_config_pb2")
pytestmark = pytest.mark.skipif(server_dir() is None, reason=SKIP_REASON)

BACKEND_STAGE = "unable to find backend library for backend 'tensorrt'"


def _engine(folder: Path, seed: int, static_first: bool = False, batch_only_output: bool = False) -> Path:
    """An engine folder (manifest + a random plan; tritonserver on CPU never opens the plan). ``batch_only_output``:
    a second output of shape [batch] (a per-sequence score)."""
    folder.mkdir()
    plan = np.random.default_rng(seed).bytes(4096)
    profiles = [{"min": [1, 1], "opt": [max(1, m // 2), 64], "max": [m, 256]} for m in (8, 16)]
    inputs = [{"name": "input_ids", "dtype": "int64", "shape": [-1, -1], **profiles[0], "profiles": profiles}]
    if static_first:
        inputs.append({"name": "lora_a", "dtype": "float16", "shape": [4, 256, 16],
                       "profiles": [{"min": [4, 256, 16], "opt": [4, 256, 16], "max": [4, 256, 16]}] * 2})
    manifest = {"format": 1, "plan": "model.plan", "backend": {"name": "tensorrt_rtx", "version": "1.7.1.116"},
                "profile": "a100", "precision": "bf16", "compute_capabilities": ["8.0"], "inputs": inputs,
                "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, -1, 1024]}]
                + ([{"name": "score", "dtype": "float32", "shape": [-1]}] if batch_only_output else []),
                "optimization_profiles": 2, "plugins": [], "onnx_sha256": "0" * 64,
                "plan_sha256": hashlib.sha256(plan).hexdigest(), "build_seconds": 0.5}
    (folder / "model.plan").write_bytes(plan)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


# Broken configs: (entry name, transform of a valid config). The first group tritonserver itself rejects while
# reading the repository; the second only the TensorRT backend could judge (it compares with the plan), so on CPU
# the server reaches backend loading with them: ``--check`` rejects both groups.
_SERVER_REJECTS = {
    "bad_field": lambda t: t.replace("max_batch_size: 8", "max_batch_size: 8\nmax_batchsize: 4"),
    "bad_enum": lambda t: t.replace("TYPE_INT64", "TYPE_INT65"),
    "bad_preferred": lambda t: t.replace("preferred_batch_size: 8", "preferred_batch_size: 16"),
    "bad_name": lambda t: t.replace('name: "bad_name"', 'name: "other"'),
    # --check used to pass these two:
    "bad_priority": lambda t: t.replace("max_queue_delay_microseconds: 100", "max_queue_delay_microseconds: 100\n"
                                        "  priority_levels: 2"),  # no default_priority_level in 1..2
    "bad_policy": lambda t: t + "version_policy { specific { versions: 2 } }\n",  # no folder 2
    "bad_format": lambda t: t.replace("data_type: TYPE_INT64", "data_type: TYPE_INT64\n  format: FORMAT_NCHW", 1),
    "bad_reshape": lambda t: t.replace("dims: -1\n  dims: 1024",
                                       "dims: -1\n  dims: 1024\n  reshape { shape: [ -1, 1000 ] }"),
    # saved by a Windows editor: "Interpreting non ascii codepoint 239" (--check reads the rest, and says so)
    "bad_bom": lambda t: "\ufeff" + t,
}
# Hand-edited configs the server accepts (it loads version 1; the priority default is in range): so does --check.
_SERVER_ACCEPTS = {
    "policy_partial": lambda t: t + "version_policy { specific { versions: [1, 2] } }\n",
    "priority_ok": lambda t: t.replace("max_queue_delay_microseconds: 100", "max_queue_delay_microseconds: 100\n"
                                       "  priority_levels: 2\n  default_priority_level: 2"),
}
_BACKEND_JUDGES = {
    "bad_profile": lambda t: t.replace('profile: "1"', 'profile: "2"'),
    "bad_dims": lambda t: t.replace("dims: -1\n  dims: 1024", "dims: [ -1, 1000 ]"),
    "bad_kind": lambda t: t.replace("KIND_GPU", "KIND_CPU"),
}
_WRITTEN = {"plain": [], "nobatch": ["--max-batch", "0"], "two_instances": ["--instances", "2"],
            "version3": ["--version", "3"]}
_KILLS = {  # entry -> (kill point, force two-rename swap)
    "killed_new": ("dir:before-rename", False), "killed_before_swap": ("dir:before-swap", False),
    "killed_swapped": ("dir:swapped", False), "killed_renamed": ("dir:renamed", True),
    "killed_between": ("dir:between-renames", True),  # last: the next write into the repository would complete it
}


def _trtforge(*argv: object, env: dict[str, str] | None = None):
    return run_console([str(a) for a in argv], env={**os.environ, **(env or {})}, timeout=120)


def _write(*argv: object) -> None:
    """``trtforge triton ...`` in-process (cheaper than a process where no kill is involved)."""
    from trtforge.build_engine.cli import main

    assert main([str(a) for a in argv]) == 0


def _entry_plan(repo: Path, name: str) -> bytes | None:
    plans = sorted((repo / name).glob("*/model.plan")) if (repo / name).is_dir() else []
    return plans[0].read_bytes() if plans else None


def _populate(tmp: Path) -> tuple[Path, dict[str, bytes], Path]:
    old, new = _engine(tmp / "old", 1), _engine(tmp / "new", 2)
    static = _engine(tmp / "static", 3, static_first=True)
    repo = tmp / "repo"
    plans = {"old": (old / "model.plan").read_bytes(), "new": (new / "model.plan").read_bytes()}
    for name, extra in _WRITTEN.items():
        _write("triton", old, "--repo", repo, "--name", name, *extra)
    _write("triton", static, "--repo", repo, "--name", "static_dims")
    # A [batch] output: dims [1] + an empty reshape (was no dims at all: "model output 'score' must specify 'dims'").
    _write("triton", _engine(tmp / "scored", 4, batch_only_output=True), "--repo", repo, "--name", "batch_only")
    shutil.copytree(repo / "batch_only", repo / "no_dims")
    cfg = repo / "no_dims" / "config.pbtxt"
    text = cfg.read_text().replace('name: "batch_only"', 'name: "no_dims"')
    assert "  dims: 1\n  reshape {\n  }\n" in text
    cfg.write_text(text.replace("  dims: 1\n  reshape {\n  }\n", ""))
    for name, fn in {**_SERVER_REJECTS, **_BACKEND_JUDGES, **_SERVER_ACCEPTS}.items():
        shutil.copytree(repo / "plain", repo / name)
        cfg = repo / name / "config.pbtxt"
        cfg.write_text(fn(cfg.read_text().replace('name: "plain"', f'name: "{name}"')))
    (repo / ".plain.3f9a2c1b.tmp").mkdir()  # what a killed trtforge before this fix left inside the repository
    (repo / "no_config" / "1").mkdir(parents=True)
    shutil.copytree(repo / "plain", repo / "no_version")
    shutil.rmtree(repo / "no_version" / "1")
    cfg = repo / "no_version" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "plain"', 'name: "no_version"'))
    _versions_and_ensembles(repo)
    return repo, plans, new


def _ensemble(repo: Path, name: str, step_model: str) -> None:
    """A hand-written ensemble over one step (a repository mixes engines with ensembles and other backends)."""
    (repo / name / "1").mkdir(parents=True)  # an ensemble's version folder holds no model file
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] }\n'
        'output { name: "LOGITS" data_type: TYPE_FP32 dims: [ -1, 1024 ] }\n'
        f'ensemble_scheduling {{ step [ {{ model_name: "{step_model}" model_version: -1 '
        'input_map { key: "input_ids" value: "IDS" } output_map { key: "logits" value: "LOGITS" } } ] }\n')


def _versions_and_ensembles(repo: Path) -> None:
    """Version folders as tritonserver reads them ("0" is a version, "01" is ignored) and ensembles beside the
    engines: ``--check`` used to refuse every ensemble (a TensorRT rule) and a sibling with only version 0, and to
    accept an entry whose only version folder was "01"."""
    for name, folder in (("v_zero", "0"), ("v_leading_zero", "01")):
        shutil.copytree(repo / "plain", repo / name)
        (repo / name / "1").rename(repo / name / folder)
        cfg = repo / name / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace('name: "plain"', f'name: "{name}"'))
    _ensemble(repo, "ensemble", "plain")
    _ensemble(repo, "ensemble_missing", "nope")


def _kill_writes(tmp: Path, repo: Path, plans: dict[str, bytes], new: Path) -> dict[str, str]:
    """Each killed write leaves its entry all-old or all-new (or, killed between the two renames of the fallback
    swap, missing until ``--check`` completes the swap); nothing of it inside the repository."""
    state: dict[str, str] = {}
    for name, (point, no_exchange) in _KILLS.items():
        if name != "killed_new":
            _write("triton", tmp / "old", "--repo", repo, "--name", name)
        before = sorted(p.name for p in repo.iterdir())
        env = {"TRTFORGE_TEST_KILL_AT": point, **({"TRTFORGE_TEST_NO_EXCHANGE": "1"} if no_exchange else {})}
        res = _trtforge("triton", new, "--repo", repo, "--name", name, "--force", env=env)
        assert res.code == -9, (name, res.code, res.err)
        after = sorted(p.name for p in repo.iterdir())
        assert set(after) <= set(before) | {name}, (name, after)
        plan = _entry_plan(repo, name)
        state[name] = {plans["old"]: "old", plans["new"]: "new", None: "missing"}[plan]
        if plan is not None:  # config, plan and manifest copy all from the same engine
            manifest = json.loads(next((repo / name).glob("*/manifest.json")).read_text())
            assert manifest["plan_sha256"] == hashlib.sha256(plan).hexdigest()
    return state


def test_server_agrees_with_check_and_survives_killed_writes(tmp_path: Path) -> None:
    repo, plans, new = _populate(tmp_path)
    killed = _kill_writes(tmp_path, repo, plans, new)
    assert killed == {"killed_new": "missing", "killed_before_swap": "old", "killed_swapped": "new",
                      "killed_between": "missing", "killed_renamed": "new"}
    run = run_server(repo, tmp_path / "server.log")
    assert run.alive, run.log[-3000:]
    accepted = {*_WRITTEN, "static_dims", "batch_only", "v_zero", *_SERVER_ACCEPTS, *_BACKEND_JUDGES,
                "killed_before_swap", "killed_swapped", "killed_renamed"}
    for name in accepted:  # the config parsed and the server went on to load the backend
        assert BACKEND_STAGE in run.reason(name), (name, run.index.get(name))
    for name in (*_SERVER_REJECTS, "no_dims", "no_config", "no_version", "v_leading_zero", ".plain.3f9a2c1b.tmp"):
        assert BACKEND_STAGE not in run.reason(name), (name, run.index.get(name))
        assert f"'{name}'" in run.log, name
    # The ensemble's config passed: the server waits on its step model (which has no TensorRT backend on CPU).
    assert "ensemble 'ensemble' depends on 'plain'" in run.log
    assert "ensemble ensemble_missing contains models that are not available or ambiguous: nope" in run.log
    assert "failed to load all models" in run.log

    from trtforge.build_engine.core.errors import CheckFailed
    from trtforge.build_engine.triton.layout import entry_problems
    from trtforge.build_engine.triton.repo import check_entry

    for name in {*accepted - set(_BACKEND_JUDGES), "ensemble"}:
        check_entry(repo / name, siblings=False)
    for name in (*_SERVER_REJECTS, *_BACKEND_JUDGES, "no_dims", "no_version", "v_leading_zero", "ensemble_missing"):
        with pytest.raises(CheckFailed):
            check_entry(repo / name, siblings=False)
    assert entry_problems(repo / "no_config") and entry_problems(repo / ".plain.3f9a2c1b.tmp")

    # The CLI: the repository fails, naming each folder the server could not load and how to remove the leftover;
    # first it completes the swap the kill interrupted between its two renames: that entry is the new one.
    assert _entry_plan(repo, "killed_between") is None
    res = _trtforge("triton", "--check", repo)
    assert _entry_plan(repo, "killed_between") == plans["new"]
    assert "completed the interrupted replacement" in res.err
    assert res.code == 1, res.err
    for name in (*_SERVER_REJECTS, *_BACKEND_JUDGES, "no_dims", "no_config", "no_version", "v_leading_zero",
                 "ensemble_missing"):
        assert f"{repo / name}" in res.err, name
    for name in ("ensemble", "v_zero", "plain", "batch_only"):
        assert f"{repo / name}/" not in res.err and f"{repo / name}:" not in res.err, (name, res.err)
    assert f"rm -rf {repo / '.plain.3f9a2c1b.tmp'}" in res.err
    res = _trtforge("triton", "--check", repo / "plain")  # a good entry in a repository the server refuses
    assert res.code == 1 and ".plain.3f9a2c1b.tmp" in res.err, res.err
    assert not (repo.parent / ".trtforge-staging").exists()
