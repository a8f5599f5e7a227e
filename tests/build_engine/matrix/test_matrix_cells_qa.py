"""build-matrix cell folders (held-out QA): a profile listed twice is one cell; two profiles of one model with the
same name (their engines shared OUTROOT/<model>/<name>, each run overwrote the other and reported both built) and a
.toml profile whose name is not one plain path component (``name = "../../victim"`` published the engine over a
folder outside OUTROOT and deleted what it held) exit 2 before anything is written. Planning only: no build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.cli import main
from trtforge.build_engine.matrix.driver import run_matrix
from trtforge.build_engine.matrix.spec import load_matrix
from trtforge_testing import CliResult, assert_one_line_error

PROFILES = Path(__file__).resolve().parents[3] / "profiles"


def _setup(root: Path, rng: np.random.Generator, profiles: str, prof_name: str | None = None) -> Path:
    w = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
                              [numpy_helper.from_array(w, "w")])
    (root / "m").mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), root / "m" / "m.onnx")
    text = (PROFILES / "a100.toml").read_text()
    if prof_name is not None:
        text = text.replace('name = "a100"', f"name = {prof_name!r}", 1)
    (root / "prof.toml").write_text(text.replace("optimization_level = 3", "optimization_level = 2"))
    (root / "mx.toml").write_text(f'[matrix]\nprofiles = {profiles}\n[[model]]\npath = "m/m.onnx"\nname = "llama"\n')
    return root / "mx.toml"


def test_profile_listed_twice_is_one_cell(tmp_path: Path, rng: np.random.Generator) -> None:
    mx = _setup(tmp_path, rng, '["a100", "a10", "a100"]')
    report = run_matrix(load_matrix(mx), tmp_path / "out", dry_run=True)
    assert [c.cell.label for c in report.cells] == ["llama/a100", "llama/a10"]


def test_dry_run_table_shows_the_keys(tmp_path: Path, rng: np.random.Generator,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """--help: '--dry-run: print the cells, keys and cache state'; the table had no key (only --json had it)."""
    mx = _setup(tmp_path, rng, '["a100", "a10"]')
    assert main(["build-matrix", str(mx), "-o", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    keys = [c.cell.key for c in run_matrix(load_matrix(mx), tmp_path / "out", dry_run=True).cells]
    assert len(set(keys)) == 2 and all(k[:16] in out for k in keys) and "planned" in out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("profiles", "prof_name", "needle"), [
    ('["a100", "prof.toml"]', None, "both named 'a100'"),  # another profile of the same name: one folder for two
    ('["prof.toml"]', "../../victim", "cannot name a cell folder"),  # would publish over tmp_path/victim
    ('["prof.toml"]', "..", "cannot name a cell folder"),
    ('["prof.toml"]', ".hidden.tmp", "cannot name a cell folder"),  # the next run's staging cleanup removes .*.tmp
    ('["a100"]', None, "report file"),  # a model named matrix.json: built, then the report failed (exit 2)
])
def test_cells_sharing_or_escaping_a_folder_exit_2(tmp_path: Path, rng: np.random.Generator,
                                                  capsys: pytest.CaptureFixture[str], profiles: str,
                                                  prof_name: str | None, needle: str) -> None:
    mx = _setup(tmp_path, rng, profiles, prof_name)
    if needle == "report file":
        mx.write_text(mx.read_text().replace('name = "llama"', 'name = "matrix.json"'))
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "precious.txt").write_text("kept")
    for extra in (["--dry-run"], []):
        code = main(["build-matrix", str(mx), "-o", str(tmp_path / "work" / "out"), *extra])
        assert_one_line_error(CliResult(code, "", capsys.readouterr().err), 2, "mx.toml", needle)
    assert not (tmp_path / "work").exists()  # nothing written
    assert (tmp_path / "victim" / "precious.txt").read_text() == "kept"


def test_lora_alias_setting_is_in_the_key_of_lora_cells(tmp_path: Path, rng: np.random.Generator,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """TRTFORGE_LORA_ALIAS=1 builds another engine for a LoRA pipeline (measured: other plan sha256): a matrix built
    without it was reported cached with it, serving the non-aliased engine."""
    from trtforge.build_engine.core import env
    from trtforge.build_engine.matrix import cells

    mx = _setup(tmp_path, rng, '["a10"]')
    lora = tmp_path / "lora.toml"
    lora.write_text(mx.read_text() + '[model.pipeline]\nlora = { targets = ["q_proj"], max_rank = 8, slots = 2 }\n')
    monkeypatch.delenv(env.LORA_ALIAS.name, raising=False)
    plain, with_lora = (cells.plan_cells(load_matrix(p))[0].key for p in (mx, lora))
    monkeypatch.setenv(env.LORA_ALIAS.name, "0")
    assert (plain, with_lora) == tuple(cells.plan_cells(load_matrix(p))[0].key for p in (mx, lora))
    monkeypatch.setenv(env.LORA_ALIAS.name, "1")
    assert cells.plan_cells(load_matrix(mx))[0].key == plain  # no LoRA node: nothing aliases
    assert cells.plan_cells(load_matrix(lora))[0].key != with_lora


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_unreachable_ray_address_exits_2_at_once(tmp_path: Path, rng: np.random.Generator,
                                                 capsys: pytest.CaptureFixture[str], scheme: str) -> None:
    """--executor ray --address HOST:PORT with no head there: ray.init waited for minutes (killed after 200 s in the
    probe) and OUTROOT was left with its lock file; now exit 2 naming --address before anything is written."""
    import socket

    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mx = _setup(tmp_path, rng, '["a100"]')
    code = main(["build-matrix", str(mx), "-o", str(tmp_path / "out"), "--executor", "ray",
                 "--address", f"{scheme}127.0.0.1:{port}"])
    assert_one_line_error(CliResult(code, "", capsys.readouterr().err), 2, "--address", "no Ray head")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("banner", [b"HTTP/1.0 400 Bad Request\r\n\r\n", b"SSH-2.0-OpenSSH_9.6\r\n"])
def test_ray_address_of_another_service_exits_2_at_once(tmp_path: Path, rng: np.random.Generator,
                                                        capsys: pytest.CaptureFixture[str], banner: bytes) -> None:
    """--address HOST:PORT where a web server or sshd listens (a wrong port): the TCP check passed, then ray.init
    retried its GCS connection for minutes (killed after 120 s in the probe); now exit 2 naming --address."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(banner)
            conn.recv(64)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    mx = _setup(tmp_path, rng, '["a100"]')
    try:
        code = main(["build-matrix", str(mx), "-o", str(tmp_path / "out"), "--executor", "ray",
                     "--address", f"127.0.0.1:{server.getsockname()[1]}"])
    finally:
        server.close()
    assert_one_line_error(CliResult(code, "", capsys.readouterr().err), 2, "--address", "not a Ray head")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("in_the_way", ["llama", "llama/a100"])
def test_file_where_a_cell_folder_goes_exits_2(tmp_path: Path, rng: np.random.Generator,
                                              capsys: pytest.CaptureFixture[str], in_the_way: str) -> None:
    """A file at OUTROOT/<model>/<profile> was deleted by the cell's publish (no --force anywhere), and a file at
    OUTROOT/<model> ended the run after building with "internal error: FileExistsError", every other cell lost.
    Now exit 2 naming it before anything is built, the file kept."""
    mx = _setup(tmp_path, rng, '["a100"]')
    out = tmp_path / "out"
    (out / in_the_way).parent.mkdir(parents=True, exist_ok=True)
    (out / in_the_way).write_text("someone's notes\n")
    code = main(["build-matrix", str(mx), "-o", str(out)])
    assert_one_line_error(CliResult(code, "", capsys.readouterr().err), 2, str(out / in_the_way), "not a folder")
    assert (out / in_the_way).read_text() == "someone's notes\n"
    assert not (out / "matrix.json").exists()
