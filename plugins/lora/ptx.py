"""Compile ``kernel.cu`` to PTX for one GPU architecture: NVRTC (cuda-python) when libnvrtc loads, else ``nvcc -ptx``.

Results are cached in memory and on disk (``$XDG_CACHE_HOME/trtforge/ptx`` or ``~/.cache/trtforge/ptx``) under the
SHA-256 of the source plus the architecture and compiler, so a process compiles at most once per architecture and
a machine at most once per source version. The cache is only an accelerator: a broken cache file is recompiled.
cuda-python is imported lazily (only when NVRTC is tried).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtforge.build_engine.core import env
from trtforge.build_engine.core.errors import BackendError, BuildError, InputError

KERNEL_PATH = Path(__file__).with_name("kernel.cu")
ARCHS: tuple[str, ...] = ("sm_80", "sm_86", "sm_90")  # A100, A10, H100/H200 (what the profiles target)
ENTRY_NAMES: dict[str, str] = {"float16": "lora_fused_f16", "bfloat16": "lora_fused_bf16", "float32": "lora_fused_f32"}
SIMPLE_ENTRY_NAMES: dict[str, str] = {"float16": "lora_simple_f16", "bfloat16": "lora_simple_bf16",
                                      "float32": "lora_simple_f32"}
PREPARE_ENTRY = "lora_prepare"  # once per forward: token order + chunk table (dtype-free)

_memory: dict[tuple[str, str], Ptx] = {}


@dataclass(frozen=True)
class Ptx:
    arch: str
    text: bytes  # NUL-free PTX text, what cuModuleLoadData / the AOT plugin take (append b"\0" for C APIs)
    compiler: str  # "nvrtc" or "nvcc"
    source_sha256: str

    @property
    def entries(self) -> tuple[str, ...]:
        return tuple(m.decode() for m in re.findall(rb"\.entry\s+(\w+)", self.text))

    @property
    def target(self) -> str:
        m = re.search(rb"^\s*\.target\s+(\w+)", self.text, re.M)
        return m.group(1).decode() if m else ""


def source() -> str:
    return KERNEL_PATH.read_text()


@functools.cache
def kernel_define(name: str) -> int:
    """An integer ``#define`` of kernel.cu (LORA_THREADS, LORA_TOKENS, ...), so Python never restates them.

    Cached: the launcher's per-call planning must not read the source file (host overhead shows in do_bench).
    """
    m = re.search(rf"^#define\s+{name}\s+\(?(\d+)(?:u\s*<<\s*(\d+)\))?(?:\s|$)", source(), re.M)
    if not m:
        raise KeyError(name)
    return int(m.group(1)) << int(m.group(2) or 0)


def normalize_arch(arch: str) -> str:
    """'sm_86', '8.6', '86' -> 'sm_86'; refuses architectures below sm_80 (the kernel uses bf16 cvt, sm_80+)."""
    a = arch.strip().lower().removeprefix("sm_").removeprefix("compute_").replace(".", "")
    if not a.isdigit() or int(a) < 80:
        raise InputError(f"GPU architecture {arch!r} is not supported; the LoRA kernel needs sm_80 or newer")
    return f"sm_{a}"


def _cache_dir() -> Path:
    base = env.get(env.XDG_CACHE_HOME) or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trtforge" / "ptx"


def _nvrtc(src: str, arch: str, kind: str = "ptx") -> bytes:
    """PTX (virtual arch compute_XY) or a cubin (real arch sm_XY) from NVRTC."""
    from cuda.bindings import nvrtc  # raises (ImportError/RuntimeError) when libnvrtc cannot be loaded

    def check(res: object) -> Any:
        err, *rest = res if isinstance(res, tuple) else (res,)
        if int(err) != 0:
            raise RuntimeError(f"NVRTC error {err}")
        return rest[0] if rest else None

    prog = check(nvrtc.nvrtcCreateProgram(src.encode(), b"kernel.cu", 0, [], []))
    target = f"compute_{arch[3:]}" if kind == "ptx" else arch
    opts = [f"--gpu-architecture={target}".encode(), b"-std=c++17", b"--use_fast_math"]
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            size = check(nvrtc.nvrtcGetProgramLogSize(prog))
            log = b" " * int(size)
            check(nvrtc.nvrtcGetProgramLog(prog, log))
            raise BuildError(f"NVRTC failed to compile {KERNEL_PATH} for {arch}: {log.decode(errors='replace')[:400]}")
        if kind == "ptx":
            size = check(nvrtc.nvrtcGetPTXSize(prog))
            buf = b" " * int(size)
            check(nvrtc.nvrtcGetPTX(prog, buf))
            return buf.rstrip(b"\0")
        size = check(nvrtc.nvrtcGetCUBINSize(prog))
        buf = b" " * int(size)
        check(nvrtc.nvrtcGetCUBIN(prog, buf))
        return buf
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (env.get(env.CUDA_HOME), env.get(env.CUDA_PATH), "/usr/local/cuda"):
        if home and Path(home, "bin", "nvcc").is_file():
            return str(Path(home, "bin", "nvcc"))
    return None


def _nvcc(src: str, arch: str, kind: str = "ptx") -> bytes:
    nvcc = _find_nvcc()
    if nvcc is None:
        raise BackendError("neither NVRTC (pip install cuda-python nvidia-cuda-nvrtc) nor nvcc (CUDA toolkit) is "
                           "available to compile the LoRA kernel; install one of them")
    with tempfile.TemporaryDirectory(prefix="trtforge-ptx-") as tmp:
        cu, out = Path(tmp, "kernel.cu"), Path(tmp, f"kernel.{kind}")
        cu.write_text(src)
        proc = subprocess.run([nvcc, f"-{kind}", f"-arch={arch}", "-std=c++17", "--use_fast_math", "-o", str(out),
                               str(cu)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise BuildError(f"nvcc failed to compile {KERNEL_PATH} for {arch}: {' '.join(proc.stderr.split())[:400]}")
        data = out.read_bytes()
        return data.rstrip(b"\0") if kind == "ptx" else data


def compile_ptx(arch: str, *, compiler: str = "auto", use_cache: bool = True) -> Ptx:
    """PTX of kernel.cu for ``arch``. ``compiler``: 'auto' (NVRTC, then nvcc), 'nvrtc' or 'nvcc'."""
    return _compile(arch, "ptx", compiler, use_cache)


def compile_cubin(arch: str, *, compiler: str = "auto", use_cache: bool = True) -> Ptx:
    """A cubin (machine code for exactly ``arch``; ``text`` holds the ELF bytes) of kernel.cu.

    What the launcher loads first: no driver JIT, so it also works when the compiler is newer than the driver (CUDA
    minor-version compatibility covers cubins, not PTX: a 13.5 NVRTC's PTX ISA 9.5 does not load on a 13.0 driver).
    """
    return _compile(arch, "cubin", compiler, use_cache)


def _compile(arch: str, kind: str, compiler: str, use_cache: bool) -> Ptx:
    arch = normalize_arch(arch)
    src = source()
    digest = hashlib.sha256(src.encode()).hexdigest()
    key = (digest, arch if kind == "ptx" else f"{arch}-{kind}")
    if use_cache and compiler == "auto" and key in _memory:
        return _memory[key]
    order = {"auto": ("nvrtc", "nvcc"), "nvrtc": ("nvrtc",), "nvcc": ("nvcc",)}[compiler]
    errors: list[str] = []
    for name in order:
        path = _cache_dir() / f"{digest[:16]}-{arch}-{name}.{kind}"
        if use_cache and path.is_file():
            text = path.read_bytes()
            if (b".entry" in text) if kind == "ptx" else text.startswith(b"\x7fELF"):
                ptx = Ptx(arch, text, name, digest)
                _memory[key] = ptx
                return ptx
        try:
            text = _nvrtc(src, arch, kind) if name == "nvrtc" else _nvcc(src, arch, kind)
        except BuildError:
            raise
        except Exception as exc:  # compiler not available: try the next one
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        ptx = Ptx(arch, text, name, digest)
        if use_cache:
            _memory[key] = ptx
            _store(path, text)
        return ptx
    raise BackendError(f"cannot compile the LoRA kernel for {arch}: {'; '.join(errors)}")


def _store(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        from trtforge.build_engine.core.fsutil import write_bytes

        write_bytes(path, data)
    except (OSError, InputError):  # a read-only home is fine: the cache is optional
        pass
