"""Full TensorRT only: ``LoRAOpPluginDynamic`` as a decorator plugin (``tensorrt.plugin``) with an ahead-of-time
implementation, so the engine embeds the kernel and Triton/trtexec run it without Python.

The AOT path passes the kernel only tensors and int32 scalars (no persistent scratch), in NVIDIA's order: the
inputs, then the extra scalar arguments, then the outputs. It embeds the Triton small-batch kernel
(``triton_kernel.py``: scratch-free, ``out = y + delta`` written directly), built for the engine's SM with the PTX
ISA pinned (``triton_build.PTX_ISA``) so the oldest driver the engine targets loads it. The tactic indexes
``triton_kernel.SMALL_CONFIGS``.

Split as the rest of the plugin: ``aot_launch_spec`` (plain, tested on CPU) computes the entry name, PTX, block,
grid and extra arguments as a small symbolic recipe; ``aot_functions`` builds the three decorated functions for a
given ``tensorrt.plugin`` module (tested on CPU by applying the inspection ``tensorrt.plugin`` applies), and
``register_aot`` applies the decorators (needs full TensorRT >= 10.8; TensorRT-RTX has no ``tensorrt.plugin``).

No ``from __future__ import annotations`` in this module: ``tensorrt.plugin`` inspects the decorated functions'
signatures and calls ``issubclass`` on each annotation, which fails on the strings postponed evaluation produces.
Annotations use the ``typing`` forms its docs show (``Tuple[TensorDesc]``, ``List[...]``, ``Union[str, bytes]``).
"""

# ruff: noqa: UP006, UP007, UP035  (typing.Tuple/List/Union: the forms tensorrt.plugin documents and inspects)
from dataclasses import dataclass
from typing import Any, Callable, List, Tuple, Union

from . import spec
from .triton_build import compile_image
from .triton_kernel import SMALL_CONFIGS, TritonConfig

# An extra argument is ("const", value), ("x_dim", axis): the runtime size of x's dimension `axis`, or
# ("tokens", 0): the product of x's leading dims.
Arg = Tuple[str, int]


@dataclass(frozen=True)
class AotLaunchSpec:
    kernel: str
    ptx: bytes
    block_x: int
    grid_x: Tuple[Arg, ...]  # tokens: the product of these x dims (grid x allows up to 2^31 - 1)
    grid_y: int  # O blocks (constant, <= 65535)
    shared_mem: int
    extra_args: Tuple[Arg, ...]  # triton_kernel.SCALAR_ARGS, between the 6 inputs and the output


def _cc(arch: str) -> int:
    a = arch.strip().lower().removeprefix("sm_").removeprefix("compute_").replace(".", "").rstrip("a")
    if not a.isdigit() or int(a) < 80:
        raise ValueError(f"GPU architecture {arch!r} is not supported; the LoRA kernel needs sm_80 or newer")
    return int(a)


def aot_launch_spec(fields: spec.LoraFields, x_ndim: int, slot_ndim: int, dtype: str, arch: str,
                    tactic: int = 0) -> AotLaunchSpec:
    """Everything the AOT implementation returns, for x of rank ``x_ndim`` and slot_ids of rank ``slot_ndim``."""
    if x_ndim not in (2, 3):
        raise ValueError(f"{spec.PLUGIN_NAME}: x must be 2-D or 3-D, got rank {x_ndim}")
    if slot_ndim == x_ndim - 1:
        tokens_per_slot: Arg = ("const", 1)
    elif x_ndim == 3 and slot_ndim == 1:
        tokens_per_slot = ("x_dim", 1)
    else:
        raise ValueError(f"{spec.PLUGIN_NAME}: slot_ids rank {slot_ndim} does not fit x rank {x_ndim}")
    config: TritonConfig = SMALL_CONFIGS[tactic if 0 <= tactic < len(SMALL_CONFIGS) else 0]
    image = compile_image(_cc(arch), dtype, fields.max_rank, config)
    block_o = config.effective(fields.max_rank, dtype).block_o
    return AotLaunchSpec(
        kernel=image.name, ptx=image.ptx.encode(), block_x=image.block_x,
        grid_x=tuple(("x_dim", i) for i in range(x_ndim - 1)), grid_y=-(-fields.out_features // block_o),
        shared_mem=image.shared,
        extra_args=(("tokens", 0), ("const", fields.in_features), ("const", fields.out_features),
                    ("const", fields.max_rank), ("const", fields.num_slots), tokens_per_slot))


def dtype_name(dtype: Any) -> str:
    """'float16' | 'bfloat16' | 'float32' for a TensorRT DataType (HALF, BF16, FLOAT)."""
    name = getattr(dtype, "name", str(dtype)).rsplit(".", 1)[-1].upper()
    names = {"HALF": "float16", "BF16": "bfloat16", "FLOAT": "float32"}
    if name not in names:
        raise ValueError(f"{spec.PLUGIN_NAME}: unsupported dtype {dtype}; use float16, bfloat16 or float32")
    return names[name]


def aot_functions(trtp: Any, arch: str) -> Tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """(register, autotune, aot_impl) functions for ``trtp`` (``tensorrt.plugin``), annotated with its classes."""
    def lora_desc(x: trtp.TensorDesc, y: trtp.TensorDesc, lora_a: trtp.TensorDesc, lora_b: trtp.TensorDesc,
                  slot_ids: trtp.TensorDesc, scales: trtp.TensorDesc, max_rank: int, num_slots: int,
                  in_features: int, out_features: int, tile: int) -> trtp.TensorDesc:
        return y.like()

    def lora_autotune(x: trtp.TensorDesc, y: trtp.TensorDesc, lora_a: trtp.TensorDesc, lora_b: trtp.TensorDesc,
                      slot_ids: trtp.TensorDesc, scales: trtp.TensorDesc, outputs: Tuple[trtp.TensorDesc]
                      ) -> List[trtp.AutoTuneCombination]:
        return [trtp.AutoTuneCombination("FP16|BF16|FP32, FP16|BF16|FP32, FP16|BF16|FP32, FP16|BF16|FP32, "
                                         "INT32, FP32, FP16|BF16|FP32", "LINEAR", list(range(len(SMALL_CONFIGS))))]

    def lora_aot(x: trtp.TensorDesc, y: trtp.TensorDesc, lora_a: trtp.TensorDesc, lora_b: trtp.TensorDesc,
                 slot_ids: trtp.TensorDesc, scales: trtp.TensorDesc, max_rank: int, num_slots: int,
                 in_features: int, out_features: int, tile: int, outputs: Tuple[trtp.TensorDesc], tactic: int
                 ) -> Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymIntExprs]:
        fields = spec.LoraFields(int(max_rank), int(num_slots), int(in_features), int(out_features), int(tile))
        dtype = dtype_name(x.dtype)
        s = aot_launch_spec(fields, x.ndim, slot_ids.ndim, dtype, arch, int(tactic))

        def expr(arg: Arg) -> Any:
            kind, value = arg
            if kind == "tokens":
                total = x.shape_expr[0]
                for i in range(1, x.ndim - 1):
                    total = total * x.shape_expr[i]
                return total
            return x.shape_expr[value] if kind == "x_dim" else value

        params = trtp.KernelLaunchParams()
        params.block_x = s.block_x
        params.grid_x = expr(("tokens", 0))
        params.grid_y = s.grid_y
        params.shared_mem = s.shared_mem
        extra = trtp.SymIntExprs(len(s.extra_args))
        for i, arg in enumerate(s.extra_args):
            extra[i] = trtp.SymInt32(expr(arg))
        return s.kernel, s.ptx.decode(), params, extra

    return lora_desc, lora_autotune, lora_aot


def register_aot(arch: str) -> None:  # pragma: no cover - needs full TensorRT (tensorrt.plugin)
    """Register the decorator plugin for ``arch`` (e.g. 'sm_90') with full TensorRT's ``tensorrt.plugin``."""
    import tensorrt.plugin as trtp

    qualified = f"{spec.PLUGIN_NAMESPACE}::{spec.PLUGIN_NAME}"
    desc, autotune, aot = aot_functions(trtp, arch)
    trtp.register(qualified)(desc)
    trtp.autotune(qualified)(autotune)
    trtp.aot_impl(qualified)(aot)
