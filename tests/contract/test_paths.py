"""core.paths.check, the one never-overwrite-an-input rule, at library level (no command runs, nothing is written):
devices, FIFOs and sockets; symlinks, hard links, ``..`` and case; folders that hold an input; outputs that
collide with each other. Each refusal names both paths."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from trtforge.build_engine.core import paths
from trtforge.build_engine.core.errors import InputError

from . import fixtures as fx


@pytest.mark.parametrize("device", ["/dev/full", "/dev/null", "/dev/zero"])
def test_device_output_is_refused_and_left_a_device(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"{device} is absent here")
    with pytest.raises(InputError, match="character device"):
        paths.check(files=[("-o", device)])
    with pytest.raises(InputError, match="character device"):
        paths.check(folders=[("-o", device)])
    assert not Path(device).is_file()


def test_fifo_socket_and_symlink_to_a_device_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    sock.close()
    (tmp_path / "null").symlink_to("/dev/null")
    for name, kind in (("fifo", "FIFO"), ("sock", "socket"), ("null", "character device")):
        with pytest.raises(InputError, match=kind):
            paths.check(files=[("--json", tmp_path / name)])


def test_same_file_by_every_spelling(tmp_path: Path) -> None:
    m = fx.tiny_model(tmp_path / "in.onnx")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.onnx").symlink_to(m)
    os.link(m, tmp_path / "hard.onnx")
    (tmp_path / "dirlink").symlink_to(tmp_path)
    for out in (m, tmp_path / "sub" / ".." / "in.onnx", tmp_path / "link.onnx", tmp_path / "hard.onnx",
                tmp_path / "dirlink" / "in.onnx", Path(os.path.relpath(m))):
        with pytest.raises(InputError) as err:
            paths.check(inputs=[("IN.onnx", m)], files=[("-o", out)])
        assert str(out) in err.value.message and str(m) in err.value.message
    paths.check(inputs=[("IN.onnx", m)], files=[("-o", tmp_path / "other.onnx")])  # a new file is fine


def test_case_insensitive_filesystem_is_caught_by_identity(tmp_path: Path) -> None:
    m = fx.tiny_model(tmp_path / "in.onnx")
    upper = tmp_path / "IN.ONNX"
    if not upper.exists():
        pytest.skip("this filesystem is case-sensitive (IN.ONNX is another file); identity covers the other case")
    with pytest.raises(InputError):
        paths.check(inputs=[("IN.onnx", m)], files=[("-o", upper)])


def test_external_data_and_folder_contents_are_inputs(tmp_path: Path) -> None:
    m = fx.external_model(tmp_path / "m.onnx")
    with pytest.raises(InputError, match="depends on"):
        paths.check(inputs=[("IN.onnx", m)], files=paths.onnx_output("-o", tmp_path / "m.onnx.data"))
    ad = fx.adapter(tmp_path / "ad")
    with pytest.raises(InputError, match="adapter_config.json"):
        paths.check(inputs=[("ADAPTER", ad)], files=[("-o", ad / "adapter_config.json")])


def test_output_folder_holding_an_input_is_refused(tmp_path: Path) -> None:
    (tmp_path / "src" / "deep").mkdir(parents=True)
    m = fx.tiny_model(tmp_path / "src" / "deep" / "in.onnx")
    for folder in (tmp_path / "src", tmp_path / "src" / "deep", tmp_path):
        with pytest.raises(InputError, match="contains"):
            paths.check(inputs=[("IN.onnx", m)], folders=[("-o", folder)])
    paths.check(inputs=[("IN.onnx", m)], folders=[("-o", tmp_path / "src" / "new")])  # beside it is fine
    # A symlink to the model inside the replaced folder is fine: deleting the link keeps the model.
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ref.onnx").symlink_to(m)
    paths.check(inputs=[("IN.onnx", tmp_path / "out" / "ref.onnx")], folders=[("-o", tmp_path / "out")])


def test_outputs_apart(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="name the same file"):
        paths.check(files=[("-o", tmp_path / "a.json"), ("--report", tmp_path / "x" / ".." / "a.json")])
    with pytest.raises(InputError, match="inside"):
        paths.check(files=[("--report", tmp_path / "eng" / "r.json")], folders=[("-o", tmp_path / "eng")])
