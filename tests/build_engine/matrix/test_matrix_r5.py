"""Round-5 QA regressions for build-matrix (no engine is built: the checks run before any build)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtforge.build_engine.cli import main
from trtforge_testing import CliResult, assert_one_line_error, relu_model_file, renamed_profile_file

_A = '[[model]]\npath = "m.onnx"\n'  # a valid model table (2 lines)


@pytest.mark.parametrize("body, line", [
    # model 0 has a [model.pipeline] sub-table: its header was counted as the second [[model]] (said line 3)
    ('[matrix]\nprofiles = ["a10"]\n' + _A + '[model.pipeline]\nfold = true\n[[model]]\nname = "b"\n', 7),
    # model 0 has no name, model 2 has one: model 1's bad name was reported at model 2's line (said line 10)
    ('[matrix]\nprofiles = ["a10"]\n' + _A + '[[model]]\npath = "m.onnx"\nname = "bad name"\n'
     '[[model]]\npath = "m.onnx"\nname = "c"\n', 7),
    # [matrix].profiles and model 0's profiles came before model 2's: model 1's line was model 0's (said line 5)
    ('[matrix]\nprofiles = ["a10"]\n' + _A + 'profiles = ["a10"]\n[[model]]\npath = "m.onnx"\nprofiles = "a10"\n'
     '[[model]]\npath = "m.onnx"\nprofiles = ["a10"]\n', 8),
    # the same for a LoRA key: model 1's bad slots was reported at model 2's slots line (said line 10)
    ('[matrix]\nprofiles = ["a10"]\n' + _A + '[[model]]\npath = "m.onnx"\nname = "b"\n'
     'pipeline = { lora = { targets = ["w"], slots = 0 } }\n'
     '[[model]]\npath = "m.onnx"\nname = "c"\n[model.pipeline]\nlora = { targets = ["w"], slots = 2 }\n', 8),
    # a [[model]] before [matrix]: matrix.profiles was reported at the model's profiles line (said line 3)
    (_A + 'profiles = ["a10"]\n[matrix]\nprofiles = "a10"\n', 5),
])
def test_spec_error_names_the_line_of_the_offending_model(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          body: str, line: int) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")  # load_matrix only checks that the file exists
    (tmp_path / "mx.toml").write_text(body)
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run"])
    assert_one_line_error(CliResult(code, "", capsys.readouterr().err), 2, f"mx.toml:{line}: ")
    assert not (tmp_path / "out").exists()


def test_profile_path_without_toml_suffix_is_relative_to_the_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # old: only refs ending in .toml were read relative to the matrix file; "sub/gpu" was read from the working
    # directory (refused as 'profile file sub/gpu not found' from anywhere else, exit 1)
    import json

    relu_model_file(tmp_path / "m.onnx")
    renamed_profile_file(tmp_path / "sub" / "gpu", "gpu")
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["sub/gpu"]\n' + _A)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    (cell,) = json.loads(out)["cells"]
    assert (cell["profile"], cell["status"]) == ("gpu", "planned")


def test_two_profiles_of_one_name_without_toml_suffix_are_refused(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # old: the name check (one folder per cell) read only .toml refs: "a10" and a profile file "sub/gpu" named a10
    # both planned OUTROOT/m/a10 (dry run exit 0; a build published one over the other, both reported built)
    relu_model_file(tmp_path / "m.onnx")
    renamed_profile_file(tmp_path / "sub" / "gpu", "a10")
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a10", "sub/gpu"]\n' + _A)
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run"])
    assert_one_line_error(CliResult(code, "", capsys.readouterr().err), 2, "'a10'", "'sub/gpu'", "OUTROOT/m/a10")


@pytest.mark.parametrize("dry", [True, False])
def test_missing_external_data_is_exit_2_before_outroot(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         dry: bool) -> None:
    # old: planning hashed the model's external data and the missing file raised: 'internal error:
    # FileNotFoundError' (exit 3) for the whole matrix, after OUTROOT and its lock file were made
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtforge_testing import seeded_rng

    w = numpy_helper.from_array(seeded_rng("ext").standard_normal((8, 4)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx",
              save_as_external_data=True, location="m.bin", size_threshold=0)
    (tmp_path / "m.bin").unlink()
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a10"]\n' + _A)
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), *(["--dry-run"] * dry)])
    assert_one_line_error(CliResult(code, "", capsys.readouterr().err), 2, "model 'm'", "'m.bin'", "cannot be read")
    assert not (tmp_path / "out").exists()


def test_triton_repo_that_is_a_file_is_refused_at_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # old: the dry run passed and a real run built every cell, then added none ('not added to the Triton
    # repository: --repo ...: exists and is not a folder' in each reason) and exited 0
    relu_model_file(tmp_path / "m.onnx")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a10"]\n' + _A + '[triton]\nrepo = "notes.txt"\n')
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run"])
    assert_one_line_error(CliResult(code, "", capsys.readouterr().err), 2, "mx.toml:6: triton.repo", "not a folder")
    assert (tmp_path / "notes.txt").read_text() == "x"


def test_a_run_keeps_hidden_folders_outside_its_model_folders(tmp_path: Path) -> None:
    # old: every run removed OUTROOT/*/.*.tmp and OUTROOT/*/.*.old, so with -o a folder that held other work (here a
    # run whose one cell is refused) a user's OUTROOT/photos/.album.tmp and OUTROOT/notes/.draft.old were deleted;
    # now only this matrix's model folders are swept (OUTROOT/m/.x.tmp, a killed run's leftover, still goes)
    relu_model_file(tmp_path / "m.onnx")
    out = tmp_path / "out"
    for rel in ("photos/.album.tmp/img.txt", "notes/.draft.old/n.txt", "m/.x.tmp/part"):
        (out / rel).parent.mkdir(parents=True)
        (out / rel).write_text("keep")
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["no-such-gpu"]\n' + _A)
    assert main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(out)]) == 1  # the cell is refused
    assert (out / "photos/.album.tmp/img.txt").read_text() == "keep"
    assert (out / "notes/.draft.old/n.txt").read_text() == "keep"
    assert not (out / "m" / ".x.tmp").exists()


def test_model_path_of_a_folder_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # old: 'model file .../models not found' for a folder that exists
    (tmp_path / "models").mkdir()
    (tmp_path / "mx.toml").write_text('[matrix]\nprofiles = ["a10"]\n[[model]]\npath = "models"\n')
    code = main(["build-matrix", str(tmp_path / "mx.toml"), "-o", str(tmp_path / "out"), "--dry-run"])
    assert_one_line_error(CliResult(code, "", capsys.readouterr().err), 2, "mx.toml:4: path:", "a folder")
