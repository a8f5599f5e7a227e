"""trtforge triton, round 6: files edited on Windows (a UTF-8 BOM), a model named like a config file, versions the
version_policy serves, repositories whose parent or themselves cannot be written. Real TensorRT-RTX builds (one
model with int32/int64/bool/fp16 inputs and several dynamic dims, built for two profiles, reused by every test)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error, seeded_rng

BOM = b"\xef\xbb\xbf"


def _mixed_model(path: Path) -> Path:
    """z [batch, seq, 8] fp16 = (x + ids) * pos, nz [batch, past] = not mask: int32, int64, bool and fp16 inputs,
    the sequence dim under two names."""
    offset = seeded_rng("test_triton_r6.model").uniform(0.5, 2.0, (8,)).astype(np.float16)
    nodes = [helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT16),
             helper.make_node("Unsqueeze", ["idsf", "ax"], ["idsu"]),
             helper.make_node("Add", ["x", "idsu"], ["y0"]), helper.make_node("Add", ["y0", "offset"], ["y"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT16),
             helper.make_node("Unsqueeze", ["posf", "ax"], ["posu"]),
             helper.make_node("Mul", ["y", "posu"], ["z"]), helper.make_node("Not", ["mask"], ["nz"])]
    graph = helper.make_graph(
        nodes, "mixed",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", "seq"]),
         helper.make_tensor_value_info("pos", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "past"]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT16, ["batch", "seq", 8]),
         helper.make_tensor_value_info("nz", TensorProto.BOOL, ["batch", "past"])],
        [numpy_helper.from_array(offset, "offset"), numpy_helper.from_array(np.array([-1]), "ax")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The mixed model built for a100 (batch up to 16) and a10 (batch up to 8): two different engines."""
    pytest.importorskip("tensorrt_rtx")
    from trtforge.build_engine.cli import main

    d = tmp_path_factory.mktemp("triton_r6")
    src = _mixed_model(d / "m.onnx")
    for profile in ("a100", "a10"):
        assert main(["build", str(src), "--profile", profile, "-o", str(d / profile), "--no-progress"]) == 0
    return {"a100": d / "a100", "a10": d / "a10"}


def _with_bom(path: Path) -> None:
    path.write_bytes(BOM + path.read_bytes())


def test_config_with_a_bom_is_judged_as_without_one(engines: dict[str, Path], tmp_path: Path, cli) -> None:
    """A config.pbtxt saved with a BOM failed as one cryptic parse error ("Expected identifier or number, got ...")
    and no other rule ran. tritonserver 2.51 refuses such a file ("Interpreting non ascii codepoint 239"), so --check
    still fails, now with a problem naming the mark and the fix, and judges the rest at the file's own lines."""
    repo = tmp_path / "repo"
    assert cli("triton", engines["a100"], "--repo", repo, "--name", "m").code == 0
    assert cli("triton", "--check", repo / "m").code == 0
    cfg = repo / "m" / "config.pbtxt"
    text = cfg.read_text()
    _with_bom(cfg)
    res = cli("triton", "--check", repo / "m")
    assert_one_line_error(res, 1, f"{cfg}:1: starts with a UTF-8 byte-order mark", "save it as UTF-8 without a BOM")
    assert "Expected identifier" not in res.err and res.err.count(str(cfg)) == 1, res.err
    line = text.splitlines().index("max_batch_size: 16") + 1
    cfg.write_bytes(BOM + text.replace("max_batch_size: 16", "max_batch_size: 32").encode())
    res = cli("triton", "--check", repo)
    assert_one_line_error(res, 1, "byte-order mark", f"{cfg}:{line}: max_batch_size 32 exceeds")


def test_manifest_with_a_bom_is_read(engines: dict[str, Path], tmp_path: Path, cli) -> None:
    """An engine's manifest.json re-saved on Windows was 'not valid JSON (Unexpected UTF-8 BOM ...)' (exit 2) for
    the write, and exit 1 for --check of an entry holding it; the BOM is skipped, as trtforge's other readers do."""
    eng = tmp_path / "eng"
    shutil.copytree(engines["a100"], eng)
    _with_bom(eng / "manifest.json")
    res = cli("triton", eng, "--repo", tmp_path / "repo", "--name", "m")
    assert res.code == 0, res.err
    assert (tmp_path / "repo" / "m" / "1" / "manifest.json").read_bytes().startswith(BOM)
    res = cli("triton", "--check", tmp_path / "repo" / "m")
    assert res.code == 0 and "4 inputs, 2 outputs" in res.out, res.err


def test_report_with_a_bom_pairs_with_its_model(tmp_path: Path) -> None:
    """A JSON report re-saved with a BOM raised JSONDecodeError in report_matches instead of pairing it."""
    from trtforge.build_engine.core.pairing import file_identity, report_matches

    model = tmp_path / "m.onnx"
    model.write_bytes(seeded_rng("test_triton_r6.report").bytes(256))
    (tmp_path / "r.json").write_bytes(BOM + json.dumps(file_identity(model)).encode())
    assert report_matches(tmp_path / "r.json", model)


def test_model_named_config_pbtxt_is_an_entry_of_its_repository(engines: dict[str, Path], tmp_path: Path,
                                                                cli) -> None:
    """--name config.pbtxt is a valid Triton name and was written, but --check REPO then took the folder REPO/
    config.pbtxt for REPO's own config and failed with 'REPO/config.pbtxt: missing' (exit 1)."""
    repo = tmp_path / "repo"
    for name in ("config.pbtxt", "other"):
        assert cli("triton", engines["a100"], "--repo", repo, "--name", name).code == 0
    res = cli("triton", "--check", repo)
    assert res.code == 0, res.err
    assert res.out.count("is a valid Triton entry") == 2 and f"{repo / 'config.pbtxt'} is" in res.out


def _policy_repo(engines: dict[str, Path], tmp_path: Path, cli, policy: str) -> Path:
    """REPO/m: version 1 the a10 engine (batch <= 8), versions 2 and 3 the a100 engine with its config (batch 16)."""
    repo = tmp_path / "repo"
    assert cli("triton", engines["a100"], "--repo", repo, "--name", "m", "--version", "3").code == 0
    for v, eng in ((1, "a10"), (2, "a100")):
        (repo / "m" / str(v)).mkdir()
        for f in ("model.plan", "manifest.json"):
            shutil.copyfile(engines[eng] / f, repo / "m" / str(v) / f)
    with open(repo / "m" / "config.pbtxt", "a", encoding="utf-8") as fh:
        fh.write(f"version_policy {{ {policy} }}\n")
    return repo / "m"


@pytest.mark.parametrize(("policy", "ok"), [("all { }", False), ("specific { versions: [1, 3] }", False),
                                            ("latest { num_versions: 3 }", False), ("latest { num_versions: 2 }", True),
                                            ("specific { versions: [2, 3] }", True)])
def test_config_is_judged_against_every_served_version(engines: dict[str, Path], tmp_path: Path, cli, policy: str,
                                                       ok: bool) -> None:
    """The config was checked against the latest version's engine only: a served older engine it does not fit
    (max_batch_size 16 for an engine of batch <= 8) passed. Now every version the policy serves is judged."""
    entry = _policy_repo(engines, tmp_path, cli, policy)
    res = cli("triton", "--check", entry)
    if ok:
        assert res.code == 0, res.err
    else:
        assert_one_line_error(res, 1, "max_batch_size 16 exceeds the engine's largest batch 8", "for version 1")


def test_config_is_not_judged_against_a_version_left_out(engines: dict[str, Path], tmp_path: Path, cli) -> None:
    """A latest version the policy leaves out (another engine, being staged) made --check refuse an entry
    tritonserver loads: the config was judged against that version's manifest."""
    entry = _policy_repo(engines, tmp_path, cli, "specific { versions: [1] }")
    for f in ("model.plan", "manifest.json"):  # version 1 the a100 engine now, version 3 (not served) the a10 one
        shutil.copyfile(engines["a100"] / f, entry / "1" / f)
        shutil.copyfile(engines["a10"] / f, entry / "3" / f)
    res = cli("triton", "--check", entry)
    assert res.code == 0, res.err


@contextlib.contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """``folder`` not writable: by its mode, or (as root, whom modes do not stop) by a read-only bind mount."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    res = subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(folder)], capture_output=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot make a read-only folder here (mount: {res.stderr.decode().strip()})")
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_repository_in_an_unwritable_folder_is_written(engines: dict[str, Path], tmp_path: Path, cli) -> None:
    """A writable repository in a folder the user cannot write to (/srv/models owned by the user, /srv by root)
    failed with '/srv: cannot write there ... choose an output folder you can write to' (exit 2), since the entry
    is staged beside the repository; now it is staged inside it, with a warning, as for a mount point."""
    outer, writable = tmp_path / "outer", tmp_path / "writable"
    (outer / "repo").mkdir(parents=True)
    # as root the repository is a writable bind mount (of another folder) inside the read-only one
    contents = writable if os.geteuid() == 0 else outer / "repo"
    keep = contents / "other" / "7"
    keep.mkdir(parents=True)
    (keep / "model.plan").write_bytes(seeded_rng("test_triton_r6.sibling").bytes(64))
    with _read_only(outer):
        if os.geteuid() == 0:
            subprocess.run(["mount", "--bind", str(writable), str(outer / "repo")], check=True)
        try:
            for extra in ([], ["--force"]):
                res = cli("triton", engines["a100"], "--repo", outer / "repo", "--name", "m", *extra)
                assert res.code == 0, res.err
                assert "cannot write to" in res.err and "staged inside it" in res.err, res.err
            assert sorted(p.name for p in (outer / "repo").iterdir()) == ["m", "other"]
            assert (outer / "repo" / "other" / "7" / "model.plan").is_file()
            assert cli("triton", "--check", outer / "repo" / "m").code == 1  # 'other' has no config: said so
        finally:
            if os.geteuid() == 0:
                subprocess.run(["umount", str(outer / "repo")], check=True)


def test_read_only_repository_is_one_line(engines: dict[str, Path], tmp_path: Path, cli) -> None:
    """A repository that cannot be written at all: one line naming --repo (it named the repository's parent)."""
    repo = tmp_path / "repo"
    assert cli("triton", engines["a100"], "--repo", repo, "--name", "m").code == 0
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    with _read_only(repo):
        for argv in (["--name", "m2"], ["--name", "m", "--force"]):
            res = cli("triton", engines["a10"], "--repo", repo, *argv)
            assert_one_line_error(res, 2, f"--repo {repo}: cannot write there")
        assert cli("triton", "--check", repo / "m").code == 0
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before


def test_problem_of_a_tensor_with_an_escaped_name_is_at_its_line(tmp_path: Path, cli) -> None:
    """A tensor name holding '"' or '\\' is escaped in config.pbtxt, and a problem with that tensor was reported at
    the first input's line (the name was searched for unescaped)."""
    pytest.importorskip("tensorrt_rtx")
    name = 'q"uo\\te'
    scale = numpy_helper.from_array(seeded_rng("test_triton_r6.escaped").uniform(0.5, 2, (8,)).astype(np.float32), "s")
    graph = helper.make_graph([helper.make_node("Mul", [name, "s"], ["y"])], "esc",
                              [helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", "seq"]),
                               helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8]),
                               helper.make_tensor_value_info("ids_out", TensorProto.INT32, ["batch", "seq"])], [scale])
    graph.node.append(helper.make_node("Neg", ["ids"], ["ids_out"]))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    assert cli("build", tmp_path / "m.onnx", "--profile", "a10", "-o", tmp_path / "e", "--no-progress").code == 0
    assert cli("triton", tmp_path / "e", "--repo", tmp_path / "repo", "--name", "m", "--no-warmup").code == 0
    cfg = tmp_path / "repo" / "m" / "config.pbtxt"
    lines = cfg.read_text().splitlines()
    at = lines.index('  name: "q\\"uo\\\\te"') + 1
    assert lines[at + 1] == "  dims: 8", lines
    lines[at + 1] = "  dims: 9"
    cfg.write_text("\n".join(lines) + "\n")
    assert_one_line_error(cli("triton", "--check", cfg.parent), 1, f"{cfg}:{at + 2}: input {name!r}: dims [9]")


@pytest.mark.parametrize(("encoding", "needle"), [("utf-16", "UTF-16 text"), ("cp1252", "not UTF-8 text")])
def test_config_in_another_encoding_names_the_fix(engines: dict[str, Path], tmp_path: Path, cli, encoding: str,
                                                  needle: str) -> None:
    """A config.pbtxt saved as UTF-16 or cp1252 was 'unreadable ('utf-8' codec can't decode ...)', naming no fix."""
    repo = tmp_path / "repo"
    assert cli("triton", engines["a10"], "--repo", repo, "--name", "m").code == 0
    cfg = repo / "m" / "config.pbtxt"
    cfg.write_bytes(cfg.read_text().replace("# Written", "# \u00e9crit: Written").encode(encoding))
    assert_one_line_error(cli("triton", "--check", repo), 1, f"{cfg}: {needle}", "save it as UTF-8")


@pytest.mark.parametrize("dims", [["seq", "batch", 8], ["tokens", 8]])
def test_sequence_first_input_is_not_batched(tmp_path: Path, cli, dims: list[object]) -> None:
    """A sequence-first input ([seq, batch, H]) or a packed one ([tokens, H]) got max_batch_size 16 (its first dim's
    smallest profile maximum): Triton would batch requests along the sequence and refuse sequences over 16 the
    engine admits (1024). The build now records what each dim is (manifest 'axes'), and the first dim must be the
    batch; --check refuses the old config."""
    pytest.importorskip("tensorrt_rtx")
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    w = numpy_helper.from_array(seeded_rng("test_triton_r6.seqfirst").standard_normal((8, 8)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "seqfirst",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    assert cli("build", tmp_path / "m.onnx", "--profile", "a100", "-o", tmp_path / "e", "--no-progress").code == 0
    assert json.loads((tmp_path / "e" / "manifest.json").read_text())["inputs"][0]["axes"][0] == "sequence"
    assert cli("triton", tmp_path / "e", "--repo", tmp_path / "repo", "--name", "m").code == 0
    cfg_path = tmp_path / "repo" / "m" / "config.pbtxt"
    cfg = text_format.Parse(cfg_path.read_text(), model_config_pb2.ModelConfig())
    assert cfg.max_batch_size == 0 and [list(t.dims) for t in cfg.input] == [[-1 if d != 8 else 8 for d in dims]]
    assert cli("triton", "--check", cfg_path.parent).code == 0
    res = cli("triton", tmp_path / "e", "--repo", tmp_path / "repo2", "--name", "m", "--max-batch", "4")
    assert_one_line_error(res, 2, "--max-batch 4", "not a dynamic batch dimension")
    cfg.max_batch_size = 16  # what the old code wrote
    del cfg.model_warmup[:]
    for t in [*cfg.input, *cfg.output]:
        del t.dims[0]
    cfg_path.write_text(text_format.MessageToString(cfg))
    assert_one_line_error(cli("triton", "--check", cfg_path.parent), 1, "max_batch_size 16",
                          "not a dynamic batch dimension")


def test_manifest_axes_must_name_every_dim(engines: dict[str, Path], tmp_path: Path, cli) -> None:
    """A manifest whose 'axes' do not give one name per dim is refused, naming the key."""
    eng = tmp_path / "eng"
    shutil.copytree(engines["a10"], eng)
    data = json.loads((eng / "manifest.json").read_text())
    data["inputs"][0]["axes"] = ["batch"]
    (eng / "manifest.json").write_text(json.dumps(data))
    res = cli("triton", eng, "--repo", tmp_path / "repo", "--name", "m")
    assert_one_line_error(res, 2, "inputs[0] (ids).axes: expected one name per dim")


@pytest.mark.parametrize(("policy", "ok"), [("", True), ("version_policy { specific { versions: [2] } }\n", True),
                                            ("version_policy { all { } }\n", False)])
def test_version_folder_left_out_needs_no_model_file(engines: dict[str, Path], tmp_path: Path, cli, policy: str,
                                                     ok: bool) -> None:
    """An empty version folder the policy does not serve (version 1 beside the latest, 2, being removed) failed
    --check with 'REPO/m/1/model.plan: missing', though tritonserver loads version 2 only and never looks there."""
    repo = tmp_path / "repo"
    assert cli("triton", engines["a10"], "--repo", repo, "--name", "m", "--version", "2").code == 0
    (repo / "m" / "1").mkdir()
    with open(repo / "m" / "config.pbtxt", "a", encoding="utf-8") as fh:
        fh.write(policy)
    res = cli("triton", "--check", repo)
    if ok:
        assert res.code == 0 and "versions [1, 2]" in res.out, res.err
    else:
        assert_one_line_error(res, 1, f"{repo / 'm' / '1' / 'model.plan'}: missing")
