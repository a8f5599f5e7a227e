"""Full TensorRT only: ``LoRAOpPluginDynamic`` as a decorator plugin (``tensorrt.plugin``) with an ahead-of-time
implementation, so the engine embeds the kernel's PTX and Triton/trtexec run it without Python.

The AOT path can pass the kernel only tensors and int32 scalars (no persistent scratch), so it embeds the
scratch-free ``lora_simple_*`` entry point (kernel.cu), not the fused sort/shrink/expand one the Python plugin uses.

Split as the rest of the plugin: ``aot_launch_spec`` (plain, tested on CPU) computes the entry name, PTX, block,
grid and the int32 extra arguments as a small symbolic recipe; ``register_aot`` is thin decorator glue that turns
the recipe into ``trtp`` expressions. The glue needs full TensorRT (>= 10.8), which is not installed in this
project's CI, so it is untested here; TensorRT-RTX has no ``tensorrt.plugin``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import spec
from .launch import kernel_define, simple_o_tile
from .ptx import SIMPLE_ENTRY_NAMES, compile_ptx

# An extra argument is ("const", value) or ("x_dim", axis): the runtime size of x's dimension `axis`.
Arg = tuple[str, int]


@dataclass(frozen=True)
class AotLaunchSpec:
    kernel: str
    ptx: bytes
    block_x: int
    grid_x: tuple[Arg, ...]  # tokens: the product of these x dims (grid x allows up to 2^31 - 1)
    grid_y: int  # O tiles (constant, <= 65535)
    extra_args: tuple[Arg, ...]  # in kernel.cu's order after the 7 pointers


def aot_launch_spec(fields: spec.LoraFields, x_ndim: int, slot_ndim: int, dtype: str, arch: str) -> AotLaunchSpec:
    """Everything the AOT implementation returns, for x of rank ``x_ndim`` and slot_ids of rank ``slot_ndim``."""
    if x_ndim not in (2, 3):
        raise ValueError(f"{spec.PLUGIN_NAME}: x must be 2-D or 3-D, got rank {x_ndim}")
    if slot_ndim == x_ndim - 1:
        tokens_per_slot: Arg = ("const", 1)
    elif x_ndim == 3 and slot_ndim == 1:
        tokens_per_slot = ("x_dim", 1)
    else:
        raise ValueError(f"{spec.PLUGIN_NAME}: slot_ids rank {slot_ndim} does not fit x rank {x_ndim}")
    o_tile = simple_o_tile(fields.out_features)
    ptx = compile_ptx(arch)
    return AotLaunchSpec(
        kernel=SIMPLE_ENTRY_NAMES[dtype], ptx=ptx.text, block_x=kernel_define("LORA_THREADS"),
        grid_x=tuple(("x_dim", i) for i in range(x_ndim - 1)), grid_y=-(-fields.out_features // o_tile),
        extra_args=(("const", fields.in_features), ("const", fields.out_features), ("const", fields.max_rank),
                    ("const", fields.num_slots), tokens_per_slot, ("const", o_tile)))


def register_aot(arch: str) -> None:  # pragma: no cover - needs full TensorRT (tensorrt.plugin)
    """Register the decorator plugin for ``arch`` (e.g. 'sm_90') with full TensorRT's ``tensorrt.plugin``."""
    from typing import Union  # noqa: UP035  tensorrt.plugin inspects annotations; its docs use Union

    import tensorrt as trt
    import tensorrt.plugin as trtp

    qualified = f"{spec.PLUGIN_NAMESPACE}::{spec.PLUGIN_NAME}"
    dtypes = {trt.float16: "float16", trt.bfloat16: "bfloat16", trt.float32: "float32"}

    @trtp.register(qualified)
    def _desc(x: trtp.TensorDesc, y: trtp.TensorDesc, lora_a: trtp.TensorDesc, lora_b: trtp.TensorDesc,
              slot_ids: trtp.TensorDesc, scales: trtp.TensorDesc, max_rank: int, num_slots: int, in_features: int,
              out_features: int, tile: int) -> trtp.TensorDesc:
        return y.like()

    @trtp.autotune(qualified)
    def _autotune(x: trtp.TensorDesc, y: trtp.TensorDesc, lora_a: trtp.TensorDesc, lora_b: trtp.TensorDesc,
                  slot_ids: trtp.TensorDesc, scales: trtp.TensorDesc, outputs: tuple[trtp.TensorDesc, ...]
                  ) -> list[trtp.AutoTuneCombination]:
        return [trtp.AutoTuneCombination("FP16|BF16|FP32, FP16|BF16|FP32, FP16|BF16|FP32, FP16|BF16|FP32, "
                                         "INT32, FP32, FP16|BF16|FP32", "LINEAR")]

    @trtp.aot_impl(qualified)
    def _aot(x: trtp.TensorDesc, y: trtp.TensorDesc, lora_a: trtp.TensorDesc, lora_b: trtp.TensorDesc,
             slot_ids: trtp.TensorDesc, scales: trtp.TensorDesc, max_rank: int, num_slots: int, in_features: int,
             out_features: int, tile: int, outputs: tuple[trtp.TensorDesc, ...], tactic: int
             ) -> tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymExprs]:  # noqa: UP007
        fields = spec.LoraFields(int(max_rank), int(num_slots), int(in_features), int(out_features), int(tile))
        s = aot_launch_spec(fields, x.ndim, slot_ids.ndim, dtypes[x.dtype], arch)

        def expr(arg: Arg) -> Any:
            kind, value = arg
            return x.shape_expr[value] if kind == "x_dim" else value

        params = trtp.KernelLaunchParams()
        params.block_x = s.block_x
        grid_x = expr(s.grid_x[0])
        for arg in s.grid_x[1:]:
            grid_x = grid_x * expr(arg)
        params.grid_x = grid_x
        params.grid_y = s.grid_y
        params.shared_mem = 0
        extra = trtp.SymIntExprs(len(s.extra_args))
        for i, arg in enumerate(s.extra_args):
            extra[i] = trtp.SymInt32(expr(arg))
        return s.kernel, s.ptx.decode(), params, extra
