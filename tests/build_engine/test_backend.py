"""Backend selection against the real installed modules (tensorrt_rtx here; full TensorRT where installed)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import stat
from pathlib import Path

import pytest

from trtforge.build_engine.core.errors import BackendError
from trtforge.build_engine.engine import backend as backend_mod
from trtforge.build_engine.engine.backend import (
    local_gpu_compute_capabilities,
    normalize_cc,
    prepare_plugin_loading,
    rtx_libs_dir,
    select_backend,
)

HAS_TRT = importlib.util.find_spec("tensorrt") is not None
HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None
needs_rtx = pytest.mark.skipif(not HAS_RTX, reason="tensorrt_rtx not installed")


@pytest.mark.parametrize(("text", "expected"), [("8.0", "8.0"), ("8", "8.0"), ("86", "8.6"), ("sm_89", "8.9"),
                                                 ("SM120", "12.0"), (" 9.0 ", "9.0")])
def test_normalize_cc(text: str, expected: str) -> None:
    assert normalize_cc(text) == expected


def test_normalize_cc_rejects_garbage() -> None:
    with pytest.raises(BackendError, match="not like"):
        normalize_cc("ampere")


@needs_rtx
def test_auto_picks_rtx_for_ampere_and_reports_targets() -> None:
    import tensorrt_rtx

    for cc in ("8.0", "8.6"):
        b = select_backend("auto", cc)
        if HAS_TRT and b.name == "tensorrt":
            continue  # full TensorRT with a matching local GPU wins; nothing more to check here
        assert b.name == "tensorrt_rtx" and b.module is tensorrt_rtx
        assert b.version == tensorrt_rtx.__version__
        assert {"8.0", "8.6"} <= set(b.targets) and "9.0" not in b.targets
        # Targets come from the module's ComputeCapability enum, not from a list in trtforge.
        assert set(b.targets) == {normalize_cc(n[2:]) for n in tensorrt_rtx.ComputeCapability.__members__
                                  if n.startswith("SM")}
        local = local_gpu_compute_capabilities()
        assert b.can_run == any(cc in b.targets for cc in local)


@pytest.mark.skipif(HAS_TRT or not HAS_RTX, reason="needs tensorrt_rtx without full TensorRT")
def test_hopper_without_full_tensorrt_says_what_to_install() -> None:
    with pytest.raises(BackendError) as info:
        select_backend("auto", "9.0")
    msg = str(info.value)
    assert "9.0" in msg and "full TensorRT" in msg and "pypi.nvidia.com" in msg and "\n" not in msg
    assert info.value.exit_code == 2
    with pytest.raises(BackendError, match="full TensorRT is needed"):
        select_backend("tensorrt-rtx", "9.0")


@pytest.mark.skipif(HAS_TRT, reason="full TensorRT is installed here")
def test_explicit_tensorrt_missing_names_the_install() -> None:
    with pytest.raises(BackendError, match=r"pip install tensorrt --extra-index-url https://pypi.nvidia.com"):
        select_backend("tensorrt")


def test_unknown_choice() -> None:
    with pytest.raises(BackendError, match="tensorrt-rtx"):
        select_backend("onnxruntime")


@needs_rtx
def test_plugin_link_created_once_with_one_notice(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The notice is a debug record (shown with --verbose): a first use must not add a line to a one-line error.
    caplog.set_level(logging.DEBUG, logger="trtforge")
    monkeypatch.setattr(backend_mod, "_notice_printed", False)
    libs = tmp_path / "tensorrt_rtx_libs"
    libs.mkdir()
    (libs / "libtensorrt_rtx.so.1").write_bytes(os.urandom(64))
    b = select_backend("tensorrt-rtx")
    prepare_plugin_loading(b, libs)
    link = libs / "libtensorrt_rtx.so"
    assert link.is_symlink() and os.readlink(link) == "libtensorrt_rtx.so.1"
    assert link.read_bytes() == (libs / "libtensorrt_rtx.so.1").read_bytes()
    notices = [r.getMessage() for r in caplog.records if "libtensorrt_rtx" in r.getMessage()]
    assert len(notices) == 1 and str(link) in notices[0]
    assert all(r.levelno == logging.DEBUG for r in caplog.records if "libtensorrt_rtx" in r.getMessage())
    caplog.clear()
    link.unlink()
    prepare_plugin_loading(b, libs)  # created again, but the notice is once per process
    assert link.is_symlink() and not [r for r in caplog.records if "libtensorrt_rtx" in r.getMessage()]


@needs_rtx
@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only folders")
def test_plugin_link_unwritable_folder_gives_the_command(tmp_path: Path) -> None:
    libs = tmp_path / "tensorrt_rtx_libs"
    libs.mkdir()
    (libs / "libtensorrt_rtx.so.1").write_bytes(b"x")
    libs.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(BackendError) as info:
            prepare_plugin_loading(select_backend("tensorrt-rtx"), libs)
        assert f"ln -s libtensorrt_rtx.so.1 {libs / 'libtensorrt_rtx.so'}" in str(info.value)
    finally:
        libs.chmod(stat.S_IRWXU)


@needs_rtx
def test_plugin_link_in_the_real_wheel() -> None:
    b = select_backend("tensorrt-rtx")
    libs = rtx_libs_dir(b)
    assert libs is not None and (libs / "libtensorrt_rtx.so.1").exists()
    prepare_plugin_loading(b)
    assert (libs / "libtensorrt_rtx.so").exists()
    assert (libs / "libtensorrt_rtx.so").resolve() == (libs / "libtensorrt_rtx.so.1").resolve()


@needs_rtx
def test_backends_cli_json_and_table(cli) -> None:
    import tensorrt_rtx

    res = cli("backends", "--json")
    assert res.code == 0, res.err
    rows = {r["name"]: r for r in json.loads(res.out)["backends"]}
    assert rows["tensorrt_rtx"]["version"] == tensorrt_rtx.__version__
    assert "8.0" in rows["tensorrt_rtx"]["targets"] and "9.0" not in rows["tensorrt_rtx"]["targets"]
    assert ("tensorrt" in rows) == HAS_TRT
    table = cli("backends")
    assert table.code == 0 and "tensorrt_rtx" in table.out and tensorrt_rtx.__version__ in table.out
