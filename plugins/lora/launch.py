"""Launch parameters (a plain, tested function) and the cuda-python launcher of the LoRA kernel. No torch.

``plan_launch`` turns the op's fields, the token count and the tactic into the grid, block, shared memory, scratch
size and the kernel's split factors. The grid is 1-D: 1 sort block + ``max_chunks * (n_hs + n_ot)`` work blocks
(kernel.cu explains the roles). ``n_hs`` (H slices per chunk) and ``n_ot`` (O tiles per chunk) are chosen so the
work blocks number about two per SM: small batches are split across many SMs (launch-latency bound), large
batches keep the recompute of nothing and the per-block traffic low (bandwidth bound).

``LoraLauncher`` loads a cubin (else PTX) for the current device with ``cuModuleLoadData``, launches with
``cuLaunchKernel`` on a caller-given stream, with raw device pointers; it owns the kernel's scratch (zeroed once at
allocation; the kernel resets its control words itself). Safety conditions:

- One launcher per stream/execution context: two launches that overlap in time must not share a scratch (the
  TensorRT plugin gets one launcher per plugin clone, i.e. per layer and execution context).
- Launches of one launcher must be ordered (same stream, or streams ordered by events): the kernel's control words
  are reset by the previous launch's last block.
- The first launch of a size larger than any before it allocates (``cuMemAlloc`` + ``cuMemsetD8Async``): do it
  before capturing a CUDA graph (warm up), since allocation is not allowed inside a global-mode capture.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

from trtforge.build_engine.core import env
from trtforge.build_engine.core.errors import BackendError, InputError

from . import spec
from .ptx import ENTRY_NAMES, PREPARE_ENTRY, SIMPLE_ENTRY_NAMES, Ptx, compile_cubin, compile_ptx, kernel_define

DEFAULT_SM_COUNT = 132  # H100/H200 SXM; the launcher reads the real count from the device
DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic + static shared memory a block may use without opting in
FUSED_STATIC_SHARED = 6400  # kernel.cu's static __shared__ in lora_fused_* (ptxas -v: 6288 bytes), with margin


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
    n_copy: int = 0  # fused, out of place: COPY blocks (rows without adapter, y -> out)


def max_chunks(num_tokens: int, num_slots: int) -> int:
    """Upper bound on chunks (runs of <= LORA_TOKENS tokens of one slot): sum_s ceil(n_s/G) <= ceil(T/G) + min(N, T)."""
    g = kernel_define("LORA_TOKENS")
    return -(-num_tokens // g) + min(num_slots, num_tokens)


def scratch_bytes(num_tokens: int, num_slots: int, rank: int, n_hs: int) -> int:
    """ctrl[4] + 4 chunk tables + sorted[T] (int32), then vpart[n_hs][T][R] (float32); see kernel.cu."""
    words = 4 + 4 * max_chunks(num_tokens, num_slots) + num_tokens + n_hs * num_tokens * rank
    return 4 * words


def meta_bytes(num_tokens: int, num_slots: int) -> int:
    """lora_prepare's output: LORA_META_WORDS header words + 3 chunk tables + sorted[T] (int32); see kernel.cu."""
    return 4 * (kernel_define("LORA_META_WORDS") + 3 * max_chunks(num_tokens, num_slots) + num_tokens)


def prepare_args(*, slot_ids: int, meta: int, num_tokens: int, num_slots: int, tokens_per_slot: int
                 ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """lora_prepare's (values, ctypes types); one block, 8 * num_slots bytes of dynamic shared memory."""
    values = (slot_ids, meta, num_tokens, num_slots, tokens_per_slot, max_chunks(num_tokens, num_slots))
    return values, (ctypes.c_void_p, ctypes.c_void_p, *(ctypes.c_int,) * 4)


def plan_launch(fields: spec.LoraFields, num_tokens: int, dtype: str, *, tile: int | None = None,
                sm_count: int = DEFAULT_SM_COUNT, out_of_place: bool = False) -> LaunchParams:
    """Grid/block/shared memory/scratch for ``num_tokens`` tokens (product of x.shape[:-1]) of ``dtype``.
    ``out_of_place``: out != y, so COPY blocks (one per SM at most) copy the rows of tokens without an adapter."""
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
    if shared + FUSED_STATIC_SHARED > DEFAULT_SHARED_LIMIT:  # cannot happen with num_slots <= 4096, tile <= 256
        raise InputError(f"{spec.PLUGIN_NAME}: {shared} bytes of shared memory (num_slots {fields.num_slots}, tile "
                         f"{tile}) exceed the {DEFAULT_SHARED_LIMIT}-byte default; use fewer slots or a smaller tile")
    n_copy = min(num_tokens, sm_count) if out_of_place else 0
    return LaunchParams(
        kernel=ENTRY_NAMES[dtype], grid=(1 + chunks * (n_hs + n_ot) + n_copy, 1, 1), block=(threads, 1, 1),
        shared_bytes=shared, scratch_bytes=scratch_bytes(num_tokens, fields.num_slots, fields.max_rank, n_hs),
        tile=tile, n_hs=n_hs, n_ot=n_ot, max_chunks=chunks, n_copy=n_copy)


def kernel_args(p: LaunchParams, fields: spec.LoraFields, *, x: int, y: int, lora_a: int, lora_b: int,
                slot_ids: int, scales: int, scratch: int, num_tokens: int, tokens_per_slot: int, meta: int = 0,
                out: int = 0) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """cuLaunchKernel's (values, ctypes types) pair, in kernel.cu's parameter order (device pointers as ints).
    ``meta``: 0 (the launch sorts the tokens itself) or this forward's ``lora_prepare`` output; ``out``: 0 or y (in
    place) or another buffer (then ``p`` must be planned ``out_of_place``)."""
    ptrs = (x, y, lora_a, lora_b, slot_ids, scales, scratch, meta, out or y)
    ints = (num_tokens, fields.in_features, fields.out_features, fields.max_rank, fields.num_slots, tokens_per_slot,
            p.tile, p.n_hs, p.n_ot, p.max_chunks, p.n_copy)
    return (*ptrs, *ints), (*(ctypes.c_void_p,) * len(ptrs), *(ctypes.c_int,) * len(ints))


def simple_o_tile(out_features: int) -> int:
    """Columns per block of the scratch-free kernel: 1 per thread, at most 1024 (4 per thread) for wide outputs."""
    threads = kernel_define("LORA_THREADS")
    return threads if out_features <= 8 * threads else 4 * threads


MAX_GRID_X = 2**31 - 1
_MODULES: dict[tuple[int, str], tuple[Any, Ptx, str]] = {}  # (CUDA context, arch) -> loaded kernel.cu module
_SMALL: dict[tuple[int, str, int, int], tuple[Any, Any, Any]] = {}  # (ctx, dtype, rank, config) -> Triton kernel
SIMPLE_MAX_TOKENS_ENV = "TRTFORGE_LORA_SIMPLE_MAX_TOKENS"
MAX_GRID_YZ = 65535


def plan_simple(fields: spec.LoraFields, num_tokens: int, dtype: str) -> LaunchParams:
    """Launch of the scratch-free kernel (``lora_simple_*``): grid (T, ceil(O / o_tile)); used by the AOT plugin.

    Tokens go on grid x (limit 2^31 - 1) and O tiles on grid y (limit 65535; O / o_tile is at most O / 256).
    """
    if dtype not in SIMPLE_ENTRY_NAMES:
        raise InputError(f"{spec.PLUGIN_NAME}: dtype {dtype!r} is not supported; use one of {list(ENTRY_NAMES)}")
    if not 1 <= num_tokens <= MAX_GRID_X:
        raise InputError(f"{spec.PLUGIN_NAME}: num_tokens must be in [1, {MAX_GRID_X}], got {num_tokens}")
    threads = kernel_define("LORA_THREADS")
    o_tile = simple_o_tile(fields.out_features)
    return LaunchParams(kernel=SIMPLE_ENTRY_NAMES[dtype], grid=(num_tokens, -(-fields.out_features // o_tile), 1),
                        block=(threads, 1, 1), shared_bytes=0, scratch_bytes=0, tile=fields.tile, n_hs=1,
                        n_ot=-(-fields.out_features // o_tile), max_chunks=0)


def simple_args(fields: spec.LoraFields, *, x: int, y: int, lora_a: int, lora_b: int, slot_ids: int, scales: int,
                out: int, tokens_per_slot: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    ptrs = (x, y, lora_a, lora_b, slot_ids, scales, out)
    ints = (fields.in_features, fields.out_features, fields.max_rank, fields.num_slots, tokens_per_slot,
            simple_o_tile(fields.out_features))
    return (*ptrs, *ints), (*(ctypes.c_void_p,) * len(ptrs), *(ctypes.c_int,) * len(ints))


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda-python ``(CUresult, *values)`` tuple; raise BackendError naming the call and the error."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", None) or str(err)
        raise BackendError(f"LoRA launcher: {what} failed with {name} ({int(err)})")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


class LoraLauncher:
    """Loads the kernel for the current CUDA context's device and launches it (needs a GPU; cuda-python driver API).

    Launch plans and argument tuples are cached per problem size, so a launch costs one dict lookup and one
    ``cuLaunchKernel`` on the host.
    """

    def __init__(self, simple_max_tokens: int | None = None) -> None:
        """``simple_max_tokens``: ``run_op`` uses the scratch-free kernel (out of place, no copy of y) up to this many
        tokens; default ``$TRTFORGE_LORA_SIMPLE_MAX_TOKENS`` or 0 (always the fused kernel) until measurements pick a
        threshold (bench/lora_kernel.py times both)."""
        from cuda.bindings import driver

        if simple_max_tokens is None:
            simple_max_tokens = env.get_int(env.LORA_SIMPLE_MAX_TOKENS)
        self.simple_max_tokens = simple_max_tokens
        self._drv = driver
        self._module: Any = None
        self._scratch = 0
        self._scratch_size = 0
        self._plans: dict[tuple[Any, ...], LaunchParams] = {}
        _check(driver.cuInit(0), "cuInit")
        ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if ctx is None or int(ctx) == 0:  # no current context (plain script): use device 0's primary context
            dev = _check(driver.cuDeviceGet(0), "cuDeviceGet(0)")
            ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.context = ctx
        dev = _check(driver.cuCtxGetDevice(), "cuCtxGetDevice")
        attr = driver.CUdevice_attribute
        major = _check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cc major")
        minor = _check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cc minor")
        self.sm_count = int(_check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                                   "multiprocessor count"))
        self.arch = f"sm_{int(major)}{int(minor)}"
        self.cc = 10 * int(major) + int(minor)
        self._retired: list[int] = []  # outgrown scratch buffers: kept until close (captured graphs may use them)
        self.fixed_scratch = False
        self.meta, self.meta_size = 0, 0  # this layer's lora_prepare buffer (forward_meta.py), reserve_meta()
        key = (int(ctx), self.arch)
        if key not in _MODULES:  # one module per CUDA context, shared by every layer and execution context
            _MODULES[key] = self._load_module()
        self._module, self.image, self.image_kind = _MODULES[key]
        self._functions = {dt: _check(driver.cuModuleGetFunction(self._module, name.encode()), f"get {name}")
                           for dt, name in ENTRY_NAMES.items()}
        self._simple = {dt: _check(driver.cuModuleGetFunction(self._module, name.encode()), f"get {name}")
                        for dt, name in SIMPLE_ENTRY_NAMES.items()}
        self._prepare = _check(driver.cuModuleGetFunction(self._module, PREPARE_ENTRY.encode()), "get lora_prepare")

    def _load_module(self) -> tuple[Any, Ptx, str]:
        """Load the kernel: a cubin for this exact GPU first (no driver JIT, so a compiler newer than the driver is
        fine), then PTX from NVRTC or nvcc (JIT-compiled by the driver; needs a driver at least as new as the
        compiler's PTX ISA). Returns (module, image, 'cubin' | 'ptx')."""
        drv = self._drv
        tried: list[str] = []
        candidates = (("cubin", lambda: compile_cubin(self.arch)), ("ptx", lambda: compile_ptx(self.arch)),
                      ("ptx", lambda: compile_ptx(self.arch, compiler="nvcc")))
        for kind, make in candidates:
            try:
                image = make()
            except Exception as exc:  # noqa: BLE001 - that compiler is missing or failed: try the next image
                tried.append(f"{kind}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            # cuModuleLoadData reads PTX as a NUL-terminated string (the buffer adds the NUL) and a cubin by its
            # ELF headers; the buffer stays alive for the call
            buf = ctypes.create_string_buffer(image.text)
            err, module = drv.cuModuleLoadData(ctypes.addressof(buf))
            if int(err) == 0:
                return module, image, kind
            tried.append(f"{kind} from {image.compiler}: {getattr(err, 'name', err)}")
        raise BackendError(f"LoRA launcher: cannot load the kernel for {self.arch}: {'; '.join(tried)}")

    def reserve_scratch(self, nbytes: int) -> None:
        """Allocate the scratch for every later launch now (outside any capture) and never grow it afterwards."""
        if nbytes > self._scratch_size:
            self._grow_scratch(nbytes, 0)
            _check(self._drv.cuCtxSynchronize(), "cuCtxSynchronize after zeroing the scratch")
        self.fixed_scratch = True

    def reserve_meta(self, nbytes: int) -> None:
        """Allocate this layer's metadata buffer (outside any capture); kept until close, like the scratch."""
        if nbytes > self.meta_size:
            if self.meta:
                self._retired.append(self.meta)
            self.meta = int(_check(self._drv.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes}) for the LoRA metadata"))
            self.meta_size = nbytes

    def _ensure_scratch(self, nbytes: int, stream: int) -> int:
        if nbytes <= self._scratch_size:
            return self._scratch
        if self.fixed_scratch:
            raise BackendError(f"LoRA launcher: a launch needs {nbytes} bytes of scratch but {self._scratch_size} were "
                               "reserved from the optimization profile's maximum; rebuild the engine with a profile "
                               "that covers this batch")
        status = _check(self._drv.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
        if int(status) != 0:
            raise BackendError("LoRA launcher: the first launch of this size happens inside a CUDA graph capture; "
                               "launch once eagerly first (warm up) or reserve_scratch() before capturing")
        return self._grow_scratch(nbytes, stream)

    def _grow_scratch(self, nbytes: int, stream: int) -> int:
        drv = self._drv
        if self._scratch:
            # never freed while the launcher lives: graphs captured earlier keep pointing at the old buffer
            self._retired.append(self._scratch)
        size = max(nbytes, 2 * self._scratch_size, 4096)
        ptr = int(_check(drv.cuMemAlloc(size), f"cuMemAlloc({size}) for the scratch"))
        # ordered before the first launch that uses it (same stream); the kernel keeps it reset afterwards
        _check(drv.cuMemsetD8Async(ptr, 0, size, stream), "cuMemsetD8Async(scratch)")
        self._scratch, self._scratch_size = ptr, size
        return ptr

    def launch(self, stream: int, fields: spec.LoraFields, dtype: str, *, x: int, y: int, lora_a: int, lora_b: int,
               slot_ids: int, scales: int, num_tokens: int, tokens_per_slot: int = 1, tile: int | None = None,
               meta: int = 0, out: int = 0) -> None:
        """Enqueue out = y + update (``out`` 0: y, in place) on ``stream`` (an int handle; 0 = legacy default
        stream). Pointers are device ints. ``meta``: a buffer ``prepare`` filled for these slot_ids / num_tokens
        earlier in stream order, or 0."""
        if num_tokens == 0:
            return
        apart = bool(out) and int(out) != int(y)
        key = (fields, num_tokens, dtype, tile, apart)
        p = self._plans.get(key)
        if p is None:
            p = self._plans[key] = plan_launch(fields, num_tokens, dtype, tile=tile, sm_count=self.sm_count,
                                               out_of_place=apart)
        scratch = self._ensure_scratch(p.scratch_bytes, stream)
        args = kernel_args(p, fields, x=x, y=y, lora_a=lora_a, lora_b=lora_b, slot_ids=slot_ids, scales=scales,
                           scratch=scratch, num_tokens=num_tokens, tokens_per_slot=tokens_per_slot, meta=meta,
                           out=out)
        _check(self._drv.cuLaunchKernel(self._functions[dtype], *p.grid, *p.block, p.shared_bytes, stream, args, 0),
               f"cuLaunchKernel({p.kernel}, grid {p.grid}, shared {p.shared_bytes})")

    def prepare(self, stream: int, *, slot_ids: int, meta: int, num_tokens: int, num_slots: int,
                tokens_per_slot: int = 1) -> None:
        """Enqueue lora_prepare: the token order and chunk table of ``slot_ids`` into ``meta`` (``meta_bytes``)."""
        args = prepare_args(slot_ids=slot_ids, meta=meta, num_tokens=num_tokens, num_slots=num_slots,
                            tokens_per_slot=tokens_per_slot)
        _check(self._drv.cuLaunchKernel(self._prepare, 1, 1, 1, kernel_define("LORA_THREADS"), 1, 1, 8 * num_slots,
                                        stream, args, 0), "cuLaunchKernel(lora_prepare)")

    def run_op(self, stream: int, fields: spec.LoraFields, dtype: str, *, x: int, y: int, out: int, lora_a: int,
               lora_b: int, slot_ids: int, scales: int, num_tokens: int, tokens_per_slot: int = 1,
               tile: int | None = None, meta: int = 0) -> None:
        """The op as the TensorRT plugin runs it: out = y + update. ``out == y`` (aliased output) updates y in
        place; otherwise the fused kernel writes out itself (its COPY blocks copy the rows without an adapter; no
        y -> out copy before it). Up to ``simple_max_tokens`` tokens the scratch-free kernel does it instead."""
        if num_tokens == 0:
            return
        if num_tokens <= self.simple_max_tokens:
            self.launch_simple(stream, fields, dtype, x=x, y=y, out=out, lora_a=lora_a, lora_b=lora_b,
                               slot_ids=slot_ids, scales=scales, num_tokens=num_tokens,
                               tokens_per_slot=tokens_per_slot)
            return
        self.launch(stream, fields, dtype, x=x, y=y, lora_a=lora_a, lora_b=lora_b, slot_ids=slot_ids,
                    scales=scales, num_tokens=num_tokens, tokens_per_slot=tokens_per_slot, tile=tile, meta=meta,
                    out=out)

    def launch_simple(self, stream: int, fields: spec.LoraFields, dtype: str, *, x: int, y: int, lora_a: int,
                      lora_b: int, slot_ids: int, scales: int, out: int, num_tokens: int,
                      tokens_per_slot: int = 1) -> None:
        """The scratch-free kernel (what the AOT plugin embeds): out = y + update; out may equal y."""
        if num_tokens == 0:
            return
        p = plan_simple(fields, num_tokens, dtype)
        args = simple_args(fields, x=x, y=y, lora_a=lora_a, lora_b=lora_b, slot_ids=slot_ids, scales=scales, out=out,
                           tokens_per_slot=tokens_per_slot)
        _check(self._drv.cuLaunchKernel(self._simple[dtype], *p.grid, *p.block, 0, stream, args, 0),
               f"cuLaunchKernel({p.kernel}, grid {p.grid})")

    def close(self) -> None:
        """Free the scratch buffers (waits for this context's queued work first). The module stays loaded: it is
        shared by every launcher of this CUDA context and lives as long as the context."""
        if self._scratch or self._retired or self.meta:
            _check(self._drv.cuCtxSynchronize(), "cuCtxSynchronize before closing")
        for ptr in [*self._retired, self._scratch] if self._scratch else self._retired:
            _check(self._drv.cuMemFree(ptr), "cuMemFree(scratch)")
        if self.meta:
            _check(self._drv.cuMemFree(self.meta), "cuMemFree(metadata)")
        self._retired, self._scratch, self._scratch_size = [], 0, 0
        self.meta, self.meta_size = 0, 0


def spec_itemsize(dtype: str) -> int:
    """Bytes per element of a float dtype name the kernel supports."""
    return {"float16": 2, "bfloat16": 2, "float32": 4}[dtype]
