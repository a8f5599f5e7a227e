"""A new large file written around the page cache (``O_DIRECT``) where the file system allows it.

Why: a buffered write of a fresh file costs CPU per byte (a page-cache page allocated and filled for every 4 KiB).
On the 2-core machines trtforge builds on, writing a 1 GiB plan that way took ~1 CPU-second that TensorRT's
serialiser and the plan's hash were waiting for. A direct write hands the buffer to the device instead, so the
only CPU per byte left is the copy out of TensorRT's chunk and the hash.

Safety conditions (what makes the file's bytes exactly the bytes given, in order):
- Only a prefix whose length is a multiple of ``ALIGN`` goes out direct, from a buffer whose address is aligned
  (``aligned_buffer``: an anonymous mapping, page aligned); the caller keeps the unaligned rest and passes it on
  with the next chunk, and ``close`` writes the last rest with the flag cleared.
- Where the flag is refused (tmpfs on older kernels, FUSE, non-Linux) or a direct write is refused (``EINVAL``:
  an alignment the device does not accept), the file continues with plain buffered writes from the same offset;
  ``direct`` says which mode is current. A short direct write that leaves the offset unaligned also switches.
- The file is opened ``O_TRUNC`` at creation and never read through this object, so no cached page of it can be
  stale. Durability is the caller's (a commit may still fsync; after direct writes that is cheap).
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path
from typing import BinaryIO

from . import env

ALIGN = 4096  # covers every logical block size Linux file systems use for O_DIRECT (512 or 4096 bytes)


def _direct_flag() -> int:
    """``os.O_DIRECT``, or 0 where the platform has none or ``TRTFORGE_DIRECT_WRITE=0`` turns direct writes off."""
    return getattr(os, "O_DIRECT", 0) if env.get_flag(env.DIRECT_WRITE) else 0


def aligned_buffer(size: int) -> memoryview:
    """A writable, page-aligned buffer of ``size`` bytes (at least one page), its pages faulted in up front where
    Linux offers it (one call instead of a fault per page during the first copy into it)."""
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | getattr(mmap, "MAP_POPULATE", 0)
    return memoryview(mmap.mmap(-1, max(size, mmap.PAGESIZE), flags=flags))


class DirectFile:
    """An append-only new file: ``write`` aligned views for direct I/O; anything else is written buffered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0),
                                      0o666)
        self.offset = 0
        self.direct = self._set_direct(True)

    def _set_direct(self, on: bool) -> bool:
        flag = _direct_flag() if on else getattr(os, "O_DIRECT", 0)
        if not flag or self.fd is None:
            return False
        import fcntl

        try:
            flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
            fcntl.fcntl(self.fd, fcntl.F_SETFL, (flags | flag) if on else (flags & ~flag))
        except OSError:
            return False
        return on

    def _buffered(self) -> None:
        """From here on plain writes (the file system or device refused a direct one)."""
        self._set_direct(False)
        self.direct = False

    def write(self, data: memoryview) -> None:
        """Append ``data`` (all of it). Direct when ``direct`` and ``data``'s length is a multiple of ``ALIGN`` from
        an aligned address; otherwise buffered."""
        assert self.fd is not None, "write after close"
        view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        if self.direct and view.nbytes % ALIGN:
            self._buffered()
        while view.nbytes:
            try:
                n = os.write(self.fd, view)
            except OSError as exc:
                if self.direct and exc.errno == errno.EINVAL:
                    self._buffered()
                    continue
                raise
            view = view[n:]
            self.offset += n
            if self.direct and self.offset % ALIGN:
                self._buffered()

    def close(self, tail: bytes | memoryview = b"") -> None:
        """Write ``tail`` (the unaligned rest, buffered) and close."""
        if self.fd is None:
            return
        try:
            if len(tail):
                if self.direct:
                    self._buffered()
                self.write(memoryview(tail))
        finally:
            os.close(self.fd)
            self.fd = None


_COPY_CHUNK = 16 << 20  # bytes per read in a direct copy
_COPY_MIN = 8 << 20  # smaller spans are not worth a second descriptor: plain kernel copy


def copy_span(src: Path, offset: int, length: int, dst: BinaryIO) -> None:
    """Append ``length`` bytes of ``src`` from ``offset`` to the open file ``dst`` (opened for writing by path).

    Where ``dst``'s end is ``ALIGN``-aligned and the span is big: on a file system that shares extents (XFS,
    btrfs) the aligned part is cloned (``FICLONERANGE``, no bytes copied); elsewhere the bytes are read into an
    aligned buffer and written through a second, ``O_DIRECT`` descriptor of the same file at explicit offsets (the
    page-cache cost of a fresh copy avoided, as for the plan); the unaligned rest goes through ``dst`` itself.
    Otherwise a kernel copy (``copy_file_range``), else reads and writes. ``dst`` is left positioned at its new end."""
    dst.flush()  # buffered bytes first, so the copy lands after them
    pos = dst.tell()
    done = 0
    if length >= _COPY_MIN and pos % ALIGN == 0:
        done = _clone(src, offset, length, dst, pos) or _direct_copy(src, offset, length, dst, pos)
    dst.seek(pos + done)
    _kernel_copy(src, offset + done, length - done, dst)


_FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range), linux/fs.h


def _clone(src: Path, offset: int, length: int, dst: BinaryIO, pos: int) -> int:
    """Share the span's ALIGN-multiple prefix with ``src`` (copy-on-write); 0 where the file system cannot (ext4,
    tmpfs, another file system, unaligned source offset) or off Linux."""
    import struct
    import sys

    whole = length - length % ALIGN
    if not sys.platform.startswith("linux") or offset % ALIGN or not whole:
        return 0
    import fcntl

    with open(src, "rb") as fs:
        try:
            fcntl.ioctl(dst.fileno(), _FICLONERANGE, struct.pack("qQQQ", fs.fileno(), offset, whole, pos))
        except OSError:
            return 0
    return whole


def _direct_copy(src: Path, offset: int, length: int, dst: BinaryIO, pos: int) -> int:
    """Copy the ALIGN-multiple prefix of the span direct; returns the bytes copied (0 where direct I/O is refused)."""
    flag = _direct_flag()
    if not flag:
        return 0
    try:  # a second descriptor of the open file (Linux's /proc; elsewhere there is no O_DIRECT anyway)
        fd = os.open(f"/proc/self/fd/{dst.fileno()}", os.O_WRONLY | flag | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return 0
    whole = length - length % ALIGN
    buf = aligned_buffer(min(_COPY_CHUNK, whole))
    done = 0
    try:
        with open(src, "rb", buffering=0) as fs:
            fs.seek(offset)
            while done < whole:
                want = min(buf.nbytes, whole - done)
                got = fs.readinto(buf[:want])  # type: ignore[attr-defined]
                if not got:
                    raise OSError(f"{src}: file ended {length - done} bytes early")
                n = got - got % ALIGN if got < want else got
                if n == 0:
                    break  # a short read below one block: the rest is copied buffered
                try:
                    written = os.pwrite(fd, buf[:n], pos + done)
                except OSError as exc:
                    if exc.errno == errno.EINVAL:
                        break  # the device refused this alignment: the rest goes the buffered way
                    raise
                done += written
                fs.seek(offset + done)
                if written % ALIGN:
                    break
    finally:
        os.close(fd)
    return done


# copy_file_range refuses some pairs of files: across filesystems (EXDEV: a model on disk saved to /dev/shm), on
# filesystems without it (EOPNOTSUPP, ENOSYS), special files (EINVAL). The bytes are then read and written.
_NO_KERNEL_COPY = (errno.EXDEV, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL)


def _kernel_copy(src: Path, offset: int, length: int, dst: BinaryIO) -> None:
    with open(src, "rb") as fs:
        left = length
        if hasattr(os, "copy_file_range"):
            while left:
                try:
                    n = os.copy_file_range(fs.fileno(), dst.fileno(), min(left, 1 << 30), offset + length - left)
                except OSError as exc:
                    if exc.errno not in _NO_KERNEL_COPY:
                        raise
                    break
                if n == 0:
                    break
                left -= n
        fs.seek(offset + length - left)
        while left:
            block = fs.read(min(left, 1 << 24))
            if not block:
                raise OSError(f"{src}: file ended {left} bytes early")
            dst.write(block)
            left -= len(block)
        dst.flush()
