"""Round-5 QA regressions for build-matrix (no engine is built: the checks run before any build)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtforge.build_engine.cli import main
from trtforge_testing import CliResult, assert_one_line_error

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
