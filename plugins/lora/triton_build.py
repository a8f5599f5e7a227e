"""Ahead-of-time builds of the Triton small-batch kernel (``triton_kernel.py``) for one SM, without a GPU.

``compile_image(cc, dtype, rank, config)`` runs ``triton.compile(..., target=GPUTarget("cuda", cc, 32))`` with the
PTX ISA pinned to ``PTX_ISA`` (8.7: loaded by CUDA 12.8+ drivers, so also by a CUDA 13.0 driver, which refuses the
ISA 9.x a newer compiler would emit by default), then:

- drops the two trailing pointer parameters Triton (>= 3.3) appends for its global/profile scratch when the kernel
  uses neither (size 0, never referenced in the PTX), so the entry takes exactly the 6 inputs, the 6 int32 scalars
  and the output: TensorRT's AOT calling convention, and what ``LoraLauncher`` passes;
- assembles that PTX into a cubin with ``ptxas -v`` and records registers, spills and shared memory.

Needs Triton (build time only); ptxas is Triton's bundled one, else the CUDA toolkit's.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trtforge.build_engine.core.errors import BackendError, BuildError

from .triton_kernel import SMALL_CONFIGS, TritonConfig, kernel, signature

PTX_ISA = 87  # PTX ISA 8.7 (CUDA 12.8); a CUDA 13.0 driver JIT-loads PTX up to ISA 9.0
AOT_ARCHS: tuple[int, ...] = (80, 86, 89, 90)  # A100, A10, L40S, H100/H200
N_PARAMS = 13  # 6 input pointers + 6 int32 scalars + 1 output pointer


@dataclass(frozen=True)
class TritonImage:
    cc: int
    dtype: str
    config: TritonConfig
    name: str
    ptx: str  # ISA PTX_ISA, exactly N_PARAMS parameters
    cubin: bytes  # assembled from ``ptx`` for ``sm_<cc>`` (sm_90a on Hopper)
    num_warps: int
    shared: int  # dynamic shared memory bytes the launch must pass
    registers: int
    spill_bytes: int  # spill stores + spill loads reported by ptxas
    target: str

    @property
    def block_x(self) -> int:
        return 32 * self.num_warps

    @property
    def ptx_version(self) -> str:
        m = re.search(r"^\s*\.version\s+(\S+)", self.ptx, re.M)
        return m.group(1) if m else ""


def strip_scratch_params(ptx: str, name: str, keep: int = N_PARAMS) -> str:
    """Remove the entry's parameters past ``keep`` when the body never reads them (Triton's unused scratch)."""
    head, sep, rest = ptx.partition(f".entry {name}(")
    if not sep:
        raise BuildError(f"Triton PTX has no entry {name!r}")
    params, close, body = rest.partition(")")
    decls = [d.strip() for d in params.split(",") if d.strip()]
    for extra in decls[keep:]:
        pname = extra.split()[-1]
        if re.search(rf"\b{re.escape(pname)}\b", body):
            raise BuildError(f"Triton kernel {name} uses its scratch parameter {pname}; it cannot be dropped")
    if len(decls) < keep:
        raise BuildError(f"Triton kernel {name} has {len(decls)} parameters, expected at least {keep}")
    return head + sep + "\n\t" + ",\n\t".join(decls[:keep]) + "\n" + close + body


def _ptxas() -> str:
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas" if Path("/usr/local/cuda/bin/ptxas").is_file()
                                      else None)
    if found is None:
        raise BackendError("no ptxas found (install triton, or the CUDA toolkit) to assemble the Triton LoRA kernel")
    return found


def assemble(ptx: str, target: str) -> tuple[bytes, int, int]:
    """(cubin, registers, spill bytes) from ``ptxas -v``."""
    with tempfile.TemporaryDirectory(prefix="trtforge-triton-") as tmp:
        src, out = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        src.write_text(ptx)
        proc = subprocess.run([_ptxas(), f"-arch={target}", "-v", "-O3", "-o", str(out), str(src)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            detail = " ".join(proc.stderr.split())[:400]
            raise BuildError(f"ptxas failed for the Triton LoRA kernel ({target}): {detail}")
        log = proc.stdout + proc.stderr
        regs = re.search(r"Used (\d+) registers", log)
        spills = [int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
        return out.read_bytes(), int(regs.group(1)) if regs else -1, sum(spills)


@functools.cache
def compile_image(cc: int, dtype: str, rank: int, config: TritonConfig = SMALL_CONFIGS[0]) -> TritonImage:
    """The kernel for compute capability ``cc`` (80, 86, 89, 90, ...), element type ``dtype`` and ``rank``."""
    import triton
    from triton.backends.compiler import GPUTarget

    src = triton.compiler.ASTSource(fn=kernel(), signature=signature(dtype), constexprs=config.constexprs(rank, dtype))
    try:
        options = {"num_warps": config.effective(rank, dtype).num_warps, "ptx_version": PTX_ISA}
        compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
    except Exception as exc:
        raise BuildError(f"triton.compile failed for the LoRA kernel (sm_{cc}, {dtype}, rank {rank}): {exc}") from exc
    meta = compiled.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise BuildError(f"the Triton LoRA kernel needs global scratch on sm_{cc}; it must not")
    ptx = strip_scratch_params(compiled.asm["ptx"], meta.name)
    target = re.search(r"^\s*\.target\s+(\w+)", ptx, re.M)
    arch = target.group(1) if target else f"sm_{cc}"
    cubin, regs, spills = assemble(ptx, arch)
    return TritonImage(cc=cc, dtype=dtype, config=config, name=meta.name, ptx=ptx, cubin=cubin,
                       num_warps=int(meta.num_warps), shared=int(meta.shared), registers=regs, spill_bytes=spills,
                       target=arch)
