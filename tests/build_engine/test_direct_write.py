"""The plan's direct (O_DIRECT) write: the file holds exactly the bytes given, in order, for chunk sizes aligned or
not, and where the file system refuses direct I/O the same bytes arrive through buffered writes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from trtforge.build_engine.core.direct_write import ALIGN, DirectFile, aligned_buffer


def _trt() -> object:
    return pytest.importorskip("tensorrt_rtx")


def _sizes(rng: np.random.Generator) -> list[int]:
    """Chunk sizes of every kind: aligned, one off either side, below one block, large and odd."""
    return [ALIGN, 3 * ALIGN + 1, ALIGN - 1, 17, 2 * ALIGN, int(rng.integers(1, 5_000_000)), 8 * ALIGN - 5,
            int(rng.integers(1, ALIGN)), 1 << 20, (9 << 20) + int(rng.integers(1, ALIGN)), 16 << 20]  # big: split copy


@pytest.mark.parametrize("knob", ["1", "0"])
def test_plan_stream_bytes_exact_direct_or_not(tmp_path: Path, rng: np.random.Generator, knob: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from trtforge.build_engine.engine.plan_stream import PlanStream

    monkeypatch.setenv("TRTFORGE_DIRECT_WRITE", knob)
    chunks = [rng.bytes(n) for n in _sizes(rng)]
    stream = PlanStream(_trt(), tmp_path / "model.plan")  # type: ignore[arg-type]
    direct_at_start = stream._file.direct
    assert all(stream.writer.write(memoryview(c)) == len(c) for c in chunks)
    sha = stream.finish()
    data = b"".join(chunks)
    assert (tmp_path / "model.plan").read_bytes() == data
    assert sha == hashlib.sha256(data).hexdigest()
    if knob == "0":
        assert not direct_at_start


def test_direct_file_switches_to_buffered_on_unaligned_write(tmp_path: Path, rng: np.random.Generator) -> None:
    f = DirectFile(tmp_path / "f")
    head = aligned_buffer(2 * ALIGN)[:2 * ALIGN]
    head[:] = rng.bytes(2 * ALIGN)
    odd = rng.bytes(ALIGN + 3)
    rest = aligned_buffer(ALIGN)[:ALIGN]
    rest[:] = rng.bytes(ALIGN)
    f.write(head)
    f.write(memoryview(odd))  # not a multiple of ALIGN: the file goes on buffered
    assert not f.direct
    f.write(rest)
    f.close(b"tail")
    assert (tmp_path / "f").read_bytes() == bytes(head) + odd + bytes(rest) + b"tail"


def test_direct_file_on_tmpfs_falls_back(rng: np.random.Generator, tmp_path: Path) -> None:
    """/dev/shm (tmpfs) refuses O_DIRECT on many kernels: whichever it does, the bytes are the same."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("needs /dev/shm")
    path = shm / f"trtforge-direct-{tmp_path.name}"
    try:
        f = DirectFile(path)
        buf = aligned_buffer(4 * ALIGN)[:4 * ALIGN]
        buf[:] = rng.bytes(4 * ALIGN)
        f.write(buf)
        f.close(b"xyz")
        assert path.read_bytes() == bytes(buf) + b"xyz"
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("knob", ["1", "0"])
def test_copy_span_exact_for_aligned_and_odd_spans(tmp_path: Path, rng: np.random.Generator, knob: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans copied into a file after content of aligned and unaligned length: big ones go direct, the rest and
    small ones by kernel copy; the result is the concatenation either way."""
    from trtforge.build_engine.core import direct_write
    from trtforge.build_engine.core.direct_write import copy_span

    monkeypatch.setenv("TRTFORGE_DIRECT_WRITE", knob)
    direct: list[int] = []
    real = direct_write._direct_copy
    monkeypatch.setattr(direct_write, "_direct_copy", lambda *a: direct.append(real(*a)) or direct[-1])
    src = tmp_path / "src.bin"
    data = rng.bytes(int(rng.integers(20 << 20, 24 << 20)))
    src.write_bytes(data)
    spans = [(0, 9 << 20), (int(rng.integers(1, 4096)), (8 << 20) + int(rng.integers(1, 4096))), (5, 100),
             (4096, 16 << 20), (int(rng.integers(0, 1 << 20)), (10 << 20) + 1)]
    expect = b""
    with open(tmp_path / "dst.bin", "wb") as dst:
        for k, (off, n) in enumerate(spans):
            pad = (-len(expect)) % 4096 or 4096  # even k: the span starts aligned; odd k: it does not
            lead = rng.bytes(pad if k % 2 == 0 else pad + int(rng.integers(1, 4095)) if pad < 4095 else 1)
            dst.write(lead)
            copy_span(src, off, n, dst)
            expect += lead + data[off:off + n]
        dst.write(b"end")
    assert (tmp_path / "dst.bin").read_bytes() == expect + b"end"
    if knob == "0":
        assert not any(direct)
    elif DirectFile(tmp_path / "probe").direct:
        assert sum(direct) == (9 << 20) + (10 << 20)  # the big spans that start aligned (k = 0, 4), minus the tail


@pytest.fixture
def reflink_dir(tmp_path: Path) -> Iterator[Path]:
    """A small XFS file system with reflink, loop-mounted (root, xfsprogs and a loop device needed; else skip)."""
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0 or not shutil.which("mkfs.xfs") or not Path("/dev/loop-control").exists():
        pytest.skip("needs root, mkfs.xfs (Debian xfsprogs) and loop devices")
    img, mnt = tmp_path / "xfs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as fh:
        fh.truncate(400 << 20)
    if subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(img)], capture_output=True).returncode != 0:
        pytest.skip("mkfs.xfs failed")
    if subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot loop-mount here (container without CAP_SYS_ADMIN?)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_copy_span_clones_on_a_reflink_file_system(reflink_dir: Path, rng: np.random.Generator,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from trtforge.build_engine.core import direct_write

    cloned: list[int] = []
    real = direct_write._clone
    monkeypatch.setattr(direct_write, "_clone", lambda *a: cloned.append(real(*a)) or cloned[-1])
    data = rng.bytes(60 << 20)
    (reflink_dir / "src.bin").write_bytes(data)
    n = (40 << 20) + int(rng.integers(1, 4096))
    with open(reflink_dir / "dst.bin", "wb") as dst:
        dst.write(b"h" * 8192)
        direct_write.copy_span(reflink_dir / "src.bin", 4096, n, dst)
        dst.write(b"end")
    assert (reflink_dir / "dst.bin").read_bytes() == b"h" * 8192 + data[4096:4096 + n] + b"end"
    assert cloned == [n - n % direct_write.ALIGN]  # the aligned part shared, the tail copied
