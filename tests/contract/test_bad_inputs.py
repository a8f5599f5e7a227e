"""The bad-input contract (issue 11), table-driven over every case of cases_paths and cases_bounds: exit 2, exactly
one ``error:`` line naming the file or flag, no traceback, every input byte-for-byte unchanged and no new file
anywhere in the case's folder. Commands run in-process (``main(argv)``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from .cases_bounds import BOUND_CASES
from .cases_paths import PATH_CASES

CASES = {**PATH_CASES, **BOUND_CASES}


def _snapshot(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir" if p.is_dir() else "special"
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_contract(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    case = CASES[name](tmp_path)
    monkeypatch.chdir(case.cwd or tmp_path)
    before = _snapshot(tmp_path)
    res = cli(*case.argv)
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert res.code == case.code, (res.code, res.err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), res.err
    assert "Traceback" not in res.err
    for needle in case.needles:
        assert needle in lines[0], (needle, lines[0])
    assert _snapshot(tmp_path) == before, "an input changed or a file was left behind"
