"""Launch parameters (a plain, tested function) and the cuda-python launcher of the LoRA kernel. No torch.

``plan_launch`` turns the op's fields, the token count and the tactic into the grid, block, shared memory, scratch
size and the kernel's split factors. The grid is 1-D: 1 sort block + ``max_chunks * (n_hs + n_ot)`` work blocks
(kernel.cu explains the roles). ``n_hs`` (H slices per chunk) and ``n_ot`` (O tiles per chunk) are chosen so the
work blocks number about two per SM: small batches are split across many SMs (launch-latency bound), large
batches keep the recompute of nothing and the per-block traffic low (bandwidth bound).

``LoraLauncher`` loads the PTX for the current device with ``cuModuleLoadData`` and launches with ``cuLaunchKernel``
on a caller-given stream, with raw device pointers; it owns the kernel's scratch (zeroed once at allocation; the
kernel resets its control words itself). One launcher per stream/execution context: two launches that overlap in
time must not share a scratch.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

from trtforge.build_engine.errors import BackendError, InputError
from trtforge.plugins.lora import spec
from trtforge.plugins.lora.ptx import ENTRY_NAMES, SIMPLE_ENTRY_NAMES, compile_ptx, kernel_define

DEFAULT_SM_COUNT = 132  # H100/H200 SXM; the launcher reads the real count from the device


@dataclass(frozen=True)
class LaunchParams:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    scratch_bytes: int
    tile: int
    n_hs: int
    n_ot: int
    max_chunks: int


def max_chunks(num_tokens: int, num_slots: int) -> int:
    """Upper bound on chunks (runs of <= LORA_TOKENS tokens of one slot): sum_s ceil(n_s/G) <= ceil(T/G) + min(N, T)."""
    g = kernel_define("LORA_TOKENS")
    return -(-num_tokens // g) + min(num_slots, num_tokens)


def scratch_bytes(num_tokens: int, num_slots: int, rank: int, n_hs: int) -> int:
    """ctrl[4] + 4 chunk tables + sorted[T] (int32), then vpart[n_hs][T][R] (float32); see kernel.cu."""
    words = 4 + 4 * max_chunks(num_tokens, num_slots) + num_tokens + n_hs * num_tokens * rank
    return 4 * words


def plan_launch(fields: spec.LoraFields, num_tokens: int, dtype: str, *, tile: int | None = None,
                sm_count: int = DEFAULT_SM_COUNT) -> LaunchParams:
    """Grid/block/shared memory/scratch for ``num_tokens`` tokens (product of x.shape[:-1]) of ``dtype``."""
    if dtype not in ENTRY_NAMES:
        raise InputError(f"{spec.PLUGIN_NAME}: dtype {dtype!r} is not supported; use one of {list(ENTRY_NAMES)}")
    if num_tokens < 1:
        raise InputError(f"{spec.PLUGIN_NAME}: num_tokens must be positive, got {num_tokens}")
    tile = fields.tile if tile is None else tile
    if tile not in spec.TILE_CHOICES:
        raise InputError(f"{spec.PLUGIN_NAME}: tile {tile} is not one of {list(spec.TILE_CHOICES)}")
    threads, tokens = kernel_define("LORA_THREADS"), kernel_define("LORA_TOKENS")
    chunks = max_chunks(num_tokens, fields.num_slots)
    want = math.ceil(2 * sm_count / chunks)
    n_hs = max(1, min(want, math.ceil(fields.in_features / tile)))
    n_ot = max(1, min(want, math.ceil(fields.out_features / threads)))
    shared = 4 * max(tokens * tile, threads * tokens, 2 * fields.num_slots)
    return LaunchParams(
        kernel=ENTRY_NAMES[dtype], grid=(1 + chunks * (n_hs + n_ot), 1, 1), block=(threads, 1, 1),
        shared_bytes=shared, scratch_bytes=scratch_bytes(num_tokens, fields.num_slots, fields.max_rank, n_hs),
        tile=tile, n_hs=n_hs, n_ot=n_ot, max_chunks=chunks)


def kernel_args(p: LaunchParams, fields: spec.LoraFields, *, x: int, y: int, lora_a: int, lora_b: int,
                slot_ids: int, scales: int, scratch: int, num_tokens: int, tokens_per_slot: int
                ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """cuLaunchKernel's (values, ctypes types) pair, in kernel.cu's parameter order (device pointers as ints)."""
    ptrs = (x, y, lora_a, lora_b, slot_ids, scales, scratch)
    ints = (num_tokens, fields.in_features, fields.out_features, fields.max_rank, fields.num_slots, tokens_per_slot,
            p.tile, p.n_hs, p.n_ot, p.max_chunks)
    return (*ptrs, *ints), (*(ctypes.c_void_p,) * len(ptrs), *(ctypes.c_int,) * len(ints))


def simple_o_tile(out_features: int) -> int:
    """Columns per block of the scratch-free kernel: 1 per thread, at most 1024 (4 per thread) for wide outputs."""
    threads = kernel_define("LORA_THREADS")
    return threads if out_features <= 8 * threads else 4 * threads


def plan_simple(fields: spec.LoraFields, num_tokens: int, dtype: str) -> LaunchParams:
    """Launch of the scratch-free kernel (``lora_simple_*``): grid (ceil(O / o_tile), T); used by the AOT plugin."""
    if dtype not in SIMPLE_ENTRY_NAMES:
        raise InputError(f"{spec.PLUGIN_NAME}: dtype {dtype!r} is not supported; use one of {list(ENTRY_NAMES)}")
    threads = kernel_define("LORA_THREADS")
    o_tile = simple_o_tile(fields.out_features)
    return LaunchParams(kernel=SIMPLE_ENTRY_NAMES[dtype], grid=(-(-fields.out_features // o_tile), num_tokens, 1),
                        block=(threads, 1, 1), shared_bytes=0, scratch_bytes=0, tile=fields.tile, n_hs=1,
                        n_ot=-(-fields.out_features // o_tile), max_chunks=0)


def simple_args(fields: spec.LoraFields, *, x: int, y: int, lora_a: int, lora_b: int, slot_ids: int, scales: int,
                out: int, tokens_per_slot: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    ptrs = (x, y, lora_a, lora_b, slot_ids, scales, out)
    ints = (fields.in_features, fields.out_features, fields.max_rank, fields.num_slots, tokens_per_slot,
            simple_o_tile(fields.out_features))
    return (*ptrs, *ints), (*(ctypes.c_void_p,) * len(ptrs), *(ctypes.c_int,) * len(ints))


def _check(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise BackendError(f"CUDA driver error {err!r} in the LoRA launcher")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


class LoraLauncher:
    """Loads the kernel for the current CUDA context's device and launches it (needs a GPU; cuda-python driver API)."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        self._drv = driver
        _check(driver.cuInit(0))
        ctx = _check(driver.cuCtxGetCurrent())
        if ctx is None or int(ctx) == 0:  # no current context (plain script): use device 0's primary context
            dev = _check(driver.cuDeviceGet(0))
            ctx = _check(driver.cuDevicePrimaryCtxRetain(dev))
            _check(driver.cuCtxSetCurrent(ctx))
        dev = _check(driver.cuCtxGetDevice())
        attr = driver.CUdevice_attribute
        major = _check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
        minor = _check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
        self.sm_count = int(_check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)))
        self.arch = f"sm_{int(major)}{int(minor)}"
        self.ptx = compile_ptx(self.arch)
        self._module = _check(driver.cuModuleLoadData(self.ptx.text + b"\0"))
        self._functions = {dt: _check(driver.cuModuleGetFunction(self._module, name.encode()))
                           for dt, name in ENTRY_NAMES.items()}
        self._simple = {dt: _check(driver.cuModuleGetFunction(self._module, name.encode()))
                        for dt, name in SIMPLE_ENTRY_NAMES.items()}
        self._scratch = 0
        self._scratch_size = 0

    def _ensure_scratch(self, nbytes: int, stream: int) -> int:
        if nbytes <= self._scratch_size:
            return self._scratch
        drv = self._drv
        if self._scratch:
            _check(drv.cuStreamSynchronize(stream))  # a launch still queued may use the old scratch
            _check(drv.cuMemFree(self._scratch))
        size = max(nbytes, 2 * self._scratch_size)
        ptr = _check(drv.cuMemAlloc(size))
        _check(drv.cuMemsetD8Async(ptr, 0, size, stream))
        self._scratch, self._scratch_size = ptr, size
        return ptr

    def launch(self, stream: int, fields: spec.LoraFields, dtype: str, *, x: int, y: int, lora_a: int, lora_b: int,
               slot_ids: int, scales: int, num_tokens: int, tokens_per_slot: int = 1, tile: int | None = None) -> None:
        """Enqueue y += update on ``stream`` (an int handle; 0 = legacy default stream). Pointers are device ints."""
        p = plan_launch(fields, num_tokens, dtype, tile=tile, sm_count=self.sm_count)
        scratch = int(self._ensure_scratch(p.scratch_bytes, stream))
        args = kernel_args(p, fields, x=x, y=y, lora_a=lora_a, lora_b=lora_b, slot_ids=slot_ids, scales=scales,
                           scratch=scratch, num_tokens=num_tokens, tokens_per_slot=tokens_per_slot)
        _check(self._drv.cuLaunchKernel(self._functions[dtype], *p.grid, *p.block, p.shared_bytes, stream, args, 0))

    def launch_simple(self, stream: int, fields: spec.LoraFields, dtype: str, *, x: int, y: int, lora_a: int,
                      lora_b: int, slot_ids: int, scales: int, out: int, num_tokens: int,
                      tokens_per_slot: int = 1) -> None:
        """The scratch-free kernel (what the AOT plugin embeds): out = y + update; out may equal y."""
        p = plan_simple(fields, num_tokens, dtype)
        args = simple_args(fields, x=x, y=y, lora_a=lora_a, lora_b=lora_b, slot_ids=slot_ids, scales=scales, out=out,
                           tokens_per_slot=tokens_per_slot)
        _check(self._drv.cuLaunchKernel(self._simple[dtype], *p.grid, *p.block, 0, stream, args, 0))

    def close(self) -> None:
        if self._scratch:
            _check(self._drv.cuMemFree(self._scratch))
            self._scratch, self._scratch_size = 0, 0
