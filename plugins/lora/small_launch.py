"""Launching the Triton small-batch kernel through cuda-python, and the op as the plugin runs it per tactic.

The kernel binary is ``triton_build.compile_image`` for the device's compute capability (a cubin: no driver JIT),
loaded once per CUDA context, dtype, rank and config, and shared by every layer and execution context. It needs no
scratch and writes ``out = y + delta`` itself (out may equal y), so no y -> out copy and nothing to size.
Host work per call: one dict lookup for the function, one tuple of 13 arguments, one ``cuLaunchKernel``.
"""

from __future__ import annotations

import ctypes
from typing import Any

from . import spec
from .forward_meta import REGISTRY
from .launch import _SMALL, LoraLauncher, _check, meta_bytes
from .triton_build import compile_image
from .triton_kernel import SMALL_CONFIGS
from .variants import choose

_TYPES = (*(ctypes.c_void_p,) * 6, *(ctypes.c_int,) * 6, ctypes.c_void_p)


def small_function(launcher: LoraLauncher, dtype: str, rank: int, config: int) -> tuple[Any, Any, Any]:
    """(module, function, image) of the Triton kernel on the launcher's CUDA context."""
    key = (int(launcher.context), dtype, rank, config)
    found = _SMALL.get(key)
    if found is None:
        drv = launcher._drv
        image = compile_image(launcher.cc, dtype, rank, SMALL_CONFIGS[config])
        buf = ctypes.create_string_buffer(image.cubin)
        module = _check(drv.cuModuleLoadData(ctypes.addressof(buf)), f"cuModuleLoadData(Triton {image.target})")
        function = _check(drv.cuModuleGetFunction(module, image.name.encode()), f"get {image.name}")
        found = _SMALL[key] = (module, function, image)
    return found


def launch_small(launcher: LoraLauncher, stream: int, fields: spec.LoraFields, dtype: str, config: int, *, x: int,
                 y: int, lora_a: int, lora_b: int, slot_ids: int, scales: int, out: int, num_tokens: int,
                 tokens_per_slot: int = 1) -> None:
    """out = y + update with the Triton kernel (config = index into SMALL_CONFIGS); out may equal y."""
    if num_tokens == 0:
        return
    _, function, image = small_function(launcher, dtype, fields.max_rank, config)
    block_o = SMALL_CONFIGS[config].effective(fields.max_rank, dtype).block_o
    values = (x, y, lora_a, lora_b, slot_ids, scales, num_tokens, fields.in_features, fields.out_features,
              fields.max_rank, fields.num_slots, tokens_per_slot, out)
    _check(launcher._drv.cuLaunchKernel(function, num_tokens, -(-fields.out_features // block_o), 1, image.block_x, 1,
                                        1, image.shared, stream, (values, _TYPES), 0),
           f"cuLaunchKernel({image.name}, {num_tokens} tokens)")


def run_variant(launcher: LoraLauncher, stream: int, fields: spec.LoraFields, dtype: str, variant: int, *, x: int,
                y: int, out: int, lora_a: int, lora_b: int, slot_ids: int, scales: int, num_tokens: int,
                tokens_per_slot: int = 1, context: int | None = None, owner: int = 0) -> None:
    """The op under tactic ``variant`` (variants.py): the Triton kernel or the fused one (``run_op``).

    ``context`` (an execution-context token) and ``owner`` (this layer's id) share the fused kernel's sort across
    the layers of one forward (forward_meta.py); without them every fused launch sorts for itself."""
    c = choose(variant, fields.tile, num_tokens)
    if c.kernel == "triton":
        launch_small(launcher, stream, fields, dtype, c.config, x=x, y=y, lora_a=lora_a, lora_b=lora_b,
                     slot_ids=slot_ids, scales=scales, out=out, num_tokens=num_tokens,
                     tokens_per_slot=tokens_per_slot)
    else:
        meta = 0
        if context is not None:
            own = launcher.meta if meta_bytes(num_tokens, fields.num_slots) <= launcher.meta_size else 0
            role = REGISTRY.role((context, stream, slot_ids, num_tokens, tokens_per_slot, fields.num_slots), owner,
                                 own)
            if role.prepare:
                launcher.prepare(stream, slot_ids=slot_ids, meta=role.meta, num_tokens=num_tokens,
                                 num_slots=fields.num_slots, tokens_per_slot=tokens_per_slot)
            meta = role.meta
        launcher.run_op(stream, fields, dtype, x=x, y=y, out=out, lora_a=lora_a, lora_b=lora_b, slot_ids=slot_ids,
                        scales=scales, num_tokens=num_tokens, tokens_per_slot=tokens_per_slot, tile=c.tile,
                        meta=meta)
