"""build-matrix: local and Ray executors build the same engines, reruns are cached, crashed workers are retried,
infeasible cells are refused at once, a bad model fails only its cells, a bad matrix exits 2 naming the line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trtforge.build_engine.cli import main
from trtforge.build_engine.matrix.driver import run_matrix
from trtforge.build_engine.matrix.spec import load_matrix
from trtforge.build_engine.matrix.worker import KILL_ONCE_ENV
from trtforge.examples.make_example import write_example
from trtforge_testing import assert_one_line_error

pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds the engines (pip install 'trtforge[rtx]')")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mx")
    write_example(root / "m", seed=7)
    (root / "m" / "broken.onnx").write_bytes(b"this is not an onnx model")
    return root


def _matrix(root: Path, text: str, name: str = "mx.toml") -> Path:
    path = root / name
    path.write_text(text)
    return path


TWO_BY_TWO = """
[matrix]
profiles = ["a10", "a100"]

[[model]]
path = "m/llama_fp32.onnx"
name = "llama"

[[model]]
path = "m/llama_fp16_autocast.onnx"
name = "llama16"
[model.pipeline]
lora = { targets = ["q_proj", "v_proj"], max_rank = 8, slots = 4 }
"""


def _engines(out: Path) -> dict[str, tuple[str, dict]]:
    got = {}
    for manifest in sorted(out.glob("*/*/manifest.json")):
        m = json.loads(manifest.read_text())
        m.pop("build_seconds")
        got[f"{manifest.parent.parent.name}/{manifest.parent.name}"] = (m["plan_sha256"], m)
    return got


@pytest.fixture(scope="module")
def local_run(models: Path) -> Path:
    out = models / "out-local"
    assert main(["build-matrix", str(_matrix(models, TWO_BY_TWO)), "-o", str(out), "--jobs", "2"]) == 0
    return out


def test_local_builds_every_cell_and_reports(local_run: Path) -> None:
    report = json.loads((local_run / "matrix.json").read_text())
    assert report["counts"] == {"built": 4, "cached": 0, "failed": 0, "refused": 0}
    engines = _engines(local_run)
    assert sorted(engines) == ["llama/a10", "llama/a100", "llama16/a10", "llama16/a100"]
    for label, (plan_sha, manifest) in engines.items():
        import hashlib

        plan = (local_run / label / "model.plan").read_bytes()
        assert hashlib.sha256(plan).hexdigest() == plan_sha
        assert manifest["profile"] == label.split("/")[1]
    assert engines["llama16/a10"][1]["plugins"][0]["name"] == "LoRAOpPluginDynamic"
    assert not list(local_run.glob(".trtforge-*staging*")) and not list(local_run.glob("*/.*"))


def test_rerun_builds_nothing(models: Path, local_run: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in local_run.glob("*/*/model.plan")}
    t0 = time.perf_counter()
    report = run_matrix(load_matrix(models / "mx.toml"), local_run)
    assert time.perf_counter() - t0 < 30  # generous: no build happens (bench/build_matrix.py measures it)
    assert [c.status for c in report.cells] == ["cached"] * 4
    assert before == {p: p.stat().st_mtime_ns for p in local_run.glob("*/*/model.plan")}


def test_changed_profile_content_or_model_rebuilds_only_that(models: Path, local_run: Path) -> None:
    spec = load_matrix(models / "mx.toml")
    report = run_matrix(spec, local_run, dry_run=True)
    assert {c.status for c in report.cells} == {"cached"}
    other = models / "m2"
    other.mkdir(exist_ok=True)
    write_example(other, seed=8)  # other weights, same names
    text = TWO_BY_TWO.replace("m/llama_fp32.onnx", "m2/llama_fp32.onnx")
    report = run_matrix(load_matrix(_matrix(models, text, "mx2.toml")), local_run, dry_run=True)
    assert [c.status for c in report.cells] == ["planned", "planned", "cached", "cached"]


def test_ray_builds_identical_engines_and_survives_a_killed_worker(models: Path, local_run: Path,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray", reason="the Ray executor needs ray (pip install 'trtforge[cluster]')")
    marks = tmp_path / "kills"
    marks.mkdir()
    monkeypatch.setenv(KILL_ONCE_ENV, str(marks))  # every cell's first attempt SIGKILLs its worker mid-build
    text = TWO_BY_TWO + '\n[[model]]\npath = "m/llama_fp32.onnx"\nname = "hopper"\nprofiles = ["h100"]\n'
    out = tmp_path / "out-ray"
    report = run_matrix(load_matrix(_matrix(models, text, "mx-ray.toml")), out, executor="ray", jobs=2, retries=2)
    status = {c.cell.label: c for c in report.cells}
    assert status["hopper/h100"].status == "refused"
    assert "trtforge_cc_9_0" in status["hopper/h100"].reason
    assert {k: v.status for k, v in status.items() if k != "hopper/h100"} == dict.fromkeys(
        ["llama/a10", "llama/a100", "llama16/a10", "llama16/a100"], "built")
    assert len(list(marks.iterdir())) == 4  # each built cell was killed once and retried
    ray_engines, local_engines = _engines(out), _engines(local_run)
    assert ray_engines == local_engines  # same manifests (but build time) and plan hashes as the local executor


def test_local_retry_after_sigkill_and_exhausted_retries(models: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    marks = tmp_path / "kills"
    marks.mkdir()
    monkeypatch.setenv(KILL_ONCE_ENV, str(marks))
    one = '[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "m/llama_fp32.onnx"\nname = "llama"\n'
    spec = load_matrix(_matrix(models, one, "one.toml"))
    report = run_matrix(spec, tmp_path / "a", retries=1)
    assert report.cells[0].status == "built" and report.cells[0].attempts == 2
    (marks / "llama__a100").unlink()
    report = run_matrix(spec, tmp_path / "b", retries=0)
    assert report.cells[0].status == "failed" and "SIGKILL" in report.cells[0].reason
    assert not (tmp_path / "b" / "llama").exists()  # no partial output


def test_bad_model_fails_its_cells_only_and_h100_is_refused_locally(models: Path, tmp_path: Path) -> None:
    text = ('[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "m/llama_fp32.onnx"\nname = "llama"\n'
            '[[model]]\npath = "m/broken.onnx"\nname = "broken"\n'
            '[[model]]\npath = "m/llama_fp32.onnx"\nname = "hopper"\nprofiles = ["h100"]\n')
    out = tmp_path / "out"
    code = main(["build-matrix", str(_matrix(models, text, "bad-model.toml")), "-o", str(out)])
    assert code == 1
    cells = {c["model"]: c for c in json.loads((out / "matrix.json").read_text())["cells"]}
    assert cells["llama"]["status"] == "built"
    assert cells["broken"]["status"] == "failed" and "broken.onnx" in cells["broken"]["reason"]
    assert cells["hopper"]["status"] == "refused" and "trtforge_cc_9_0" in cells["hopper"]["reason"]
    assert not (out / "broken").exists()


@pytest.mark.parametrize("body, needle", [
    ('[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "m/llama_fp32.onnx"\nnmae = "x"\n', "mx-bad.toml:5"),
    ('[matrix]\nprofiles = ["a100"]\nbackend = "cuda"\n[[model]]\npath = "m/llama_fp32.onnx"\n', "mx-bad.toml:3"),
    ('[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "m/missing.onnx"\n', "not found"),
    ('[matrix]\nprofiles = "a100"\n[[model]]\npath = "m/llama_fp32.onnx"\n', "mx-bad.toml:2"),
    ('[[model]]\npath = "m/llama_fp32.onnx"\n', "no profiles"),
    ('[matrix]\nprofiles = ["a100"]\n[[model]]\npath = "m/llama_fp32.onnx"\n[model.pipeline]\nprecision = "fp8"\n',
     "mx-bad.toml:6"),
    ('[matrix\n', "invalid TOML"),
])
def test_bad_matrix_exits_2_naming_the_line(models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            body: str, needle: str) -> None:
    from trtforge_testing import CliResult

    path = _matrix(models, body, "mx-bad.toml")
    code = main(["build-matrix", str(path), "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert_one_line_error(CliResult(code, "", err), 2, needle)
    assert not (tmp_path / "o").exists()


def test_output_root_holding_an_input_is_refused(models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtforge_testing import CliResult

    code = main(["build-matrix", str(models / "mx.toml"), "-o", str(models)])
    err = capsys.readouterr().err
    assert_one_line_error(CliResult(code, "", err), 2, "contains the input")
    assert "each cell folder" in err  # build-matrix replaces cell folders, not OUTROOT as a whole


def test_node_resources_names_rtx(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build-matrix", "--node-resources"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("--resources=") and " " not in out
    assert json.loads(out[len("--resources="):])["trtforge_rtx"] >= 1


def test_triton_repository_assembled_from_cached_cells(models: Path, local_run: Path) -> None:
    pytest.importorskip("tritonclient", reason="the Triton writer needs tritonclient (pip install 'trtforge[triton]')")
    from trtforge.build_engine.triton.repo import check_entry

    text = TWO_BY_TWO + '\n[triton]\nrepo = "triton-repo"\n'
    report = run_matrix(load_matrix(_matrix(models, text, "mx-triton.toml")), local_run)
    assert [c.status for c in report.cells] == ["cached"] * 4
    repo = models / "triton-repo"
    assert sorted(p.name for p in repo.iterdir()) == ["llama_a10", "llama_a100"]
    for entry in repo.iterdir():
        assert not check_entry(entry).problems
    lora = {c.cell.label: c.reason for c in report.cells if c.cell.model.name == "llama16"}
    assert all("Python plugin" in r or "plugin" in r for r in lora.values()), lora


def test_matrix_json_records_why_a_cell_is_not_in_the_triton_repository(models: Path, local_run: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """matrix.json was written before the repository was assembled: a LoRA cell's "not added to the Triton
    repository" reason was printed by --json but missing from the file --json says it prints."""
    pytest.importorskip("tritonclient", reason="the Triton writer needs tritonclient (pip install 'trtforge[triton]')")
    text = TWO_BY_TWO + '\n[triton]\nrepo = "triton-repo-json"\n'
    assert main(["build-matrix", str(_matrix(models, text, "mx-json.toml")), "-o", str(local_run), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((local_run / "matrix.json").read_text())
    reasons = {f"{c['model']}/{c['profile']}": c["reason"] for c in written["cells"]}
    assert all(reasons[f"llama16/{p}"].startswith("not added to the Triton repository") for p in ("a10", "a100"))
    assert reasons["llama/a10"] == reasons["llama/a100"] == ""
    assert [c["reason"] for c in printed["cells"]] == [c["reason"] for c in written["cells"]]
