"""``trtforge lora inject | decompose | pack``: LoRAOpPluginDynamic graph passes and PEFT adapter packing."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core import steps
from ..core.errors import InputError
from ._common import ArgumentParser, add_debug, add_file_force, make_parser, run_command

#: ``lora pack --dtype`` in the spelling of precision --to / diff --precision / kv-plan --kv-dtype -> the pool's.
_POOL_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def build_parser() -> ArgumentParser:
    p = make_parser("trtforge lora", "Inject or decompose LoRAOpPluginDynamic nodes; pack PEFT adapters into pools.")
    sub = p.add_subparsers(dest="sub", metavar="{inject,decompose,pack}", parser_class=ArgumentParser)
    sub.required = True

    inj = sub.add_parser("inject", help="put a LoRA plugin node after each target projection")
    add_debug(inj)
    inj.add_argument("input", type=Path, help="ONNX model")
    inj.add_argument("-o", "--output", type=Path, required=True, help="output ONNX model")
    add_file_force(inj)
    inj.add_argument("--targets", required=True, help="comma-separated module names, e.g. q_proj,v_proj")
    inj.add_argument("--max-rank", type=int, default=16, help="pool rank R (max adapter rank), 1..64 (default 16)")
    inj.add_argument("--slots", type=int, default=8, help="adapter slots N (default 8)")
    inj.add_argument("--tile", type=int, default=None,
                     help="fused-kernel tile along H: 32, 64, 128 or 256, written into each plugin node (default: "
                          "none written; trtforge build then writes its GPU profile's [lora] tile, other runtimes use "
                          "128)")
    inj.add_argument("--per-sequence", action="store_true", help="one slot per sequence ([batch]) not per token")

    dec = sub.add_parser("decompose", help="lower plugin nodes to standard ONNX ops")
    add_debug(dec)
    dec.add_argument("input", type=Path)
    dec.add_argument("-o", "--output", type=Path, required=True)
    add_file_force(dec)

    pk = sub.add_parser("pack", help="PEFT adapter folders -> slot-pool safetensors (adapter i -> slot i)")
    add_debug(pk)
    pk.add_argument("adapters", type=Path, nargs="+", help="PEFT adapter folders")
    pk.add_argument("-o", "--output", type=Path, required=True, help="POOL.safetensors")
    add_file_force(pk)
    pk.add_argument("--max-rank", type=int, default=None, help="pool rank (default: the model's, else the max r)")
    pk.add_argument("--slots", type=int, default=None, help="slots (default: the model's, else one per adapter)")
    src = pk.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="injected ONNX model whose lora_* inputs fix names, shapes and dtype")
    src.add_argument("--targets", help="comma-separated module names to pack (without --model)")
    pk.add_argument("--dtype", choices=(*_POOL_DTYPES, *_POOL_DTYPES.values()), default=None,
                    help="pool dtype: fp16, bf16 or fp32 as the other commands spell them (or float16, bfloat16, "
                         "float32); default: the model's, else float32")
    return p


def _targets(text: str) -> list[str]:
    out = [t.strip() for t in text.split(",") if t.strip()]
    if not out:
        raise InputError("--targets is empty; pass module names such as q_proj,v_proj")
    return out


def _load_graph(path: Path) -> Any:
    """Inject and decompose change the graph, never a weight: a model with external data is loaded without it (the
    weights stay on disk and are copied to the output's data file by ``_save``), anything else fully and checked."""
    from ..core import onnx_io

    loaded = onnx_io.load_structure(path)
    return loaded if loaded.external_data else onnx_io.load(path)


def _save(model: Any, loaded: Any, output: Path) -> None:
    from ..core import onnx_save

    if loaded.external_data:
        onnx_save.save_with_source_data(model, loaded.path, output)
    else:
        onnx_save.save_model(model, output)


def _guard_model_output(args: argparse.Namespace) -> None:
    from ..core import paths
    from ._outputs import check_outputs

    check_outputs(*paths.onnx_output("-o", args.output), inputs=[("IN.onnx", args.input)])


def _inject(args: argparse.Namespace) -> int:
    from trtforge.plugins.lora import spec
    from trtforge.plugins.lora.inject import inject

    _guard_model_output(args)
    if args.tile is not None and args.tile not in spec.TILE_CHOICES:  # the flag's value: named as the flag
        raise InputError(f"--tile {args.tile}: choose one of {', '.join(map(str, spec.TILE_CHOICES))}")
    loaded = _load_graph(args.input)
    try:
        out = inject(loaded.model, _targets(args.targets), args.max_rank, args.slots, per_sequence=args.per_sequence,
                     tile=args.tile, inplace=True)
    except InputError as exc:
        raise InputError(f"{args.input}: {exc.message}") from exc
    _save(out, loaded, args.output)
    n = sum(1 for node in out.graph.node if spec.is_lora_node(node))
    print(f"{args.output}: {n} {spec.PLUGIN_NAME} node(s), rank {args.max_rank}, {args.slots} slots; "
          f"{steps.elapsed():.2f} s in all (load to save)")
    return 0


def _decompose(args: argparse.Namespace) -> int:
    from trtforge.plugins import has_plugin_nodes
    from trtforge.plugins.lora.decompose import decompose

    _guard_model_output(args)
    loaded = _load_graph(args.input)
    if not has_plugin_nodes(loaded.model):
        raise InputError(f"{args.input}: has no LoRAOpPluginDynamic nodes; nothing to decompose")
    try:
        out = decompose(loaded.model, inplace=True)
    except InputError as exc:
        raise InputError(f"{args.input}: {exc.message}") from exc
    _save(out, loaded, args.output)
    print(f"{args.output}: plugin nodes lowered to standard ONNX ops; {steps.elapsed():.2f} s in all (load to save)")
    return 0


def _pack(args: argparse.Namespace) -> int:
    from trtforge.plugins.lora import pack as pk

    from ._outputs import check_outputs

    check_outputs(("-o", args.output), inputs=[*(("ADAPTER", a) for a in args.adapters), ("--model", args.model)])
    adapters = [pk.load_adapter(Path(a)) for a in args.adapters]
    dtype = _POOL_DTYPES.get(args.dtype, args.dtype)
    if args.model is not None:
        layout = pk.layout_from_model(args.model)
        over = {"max-rank": (args.max_rank, layout.max_rank), "slots": (args.slots, layout.num_slots),
                "dtype": (dtype, layout.dtype)}
        for key, (value, model_value) in over.items():
            if value is not None and value != model_value:
                raise InputError(f"--{key} {value} disagrees with {args.model} ({model_value}); drop the option "
                                 "or re-inject")
    else:
        targets = _targets(args.targets) if args.targets is not None else None  # '' is refused, not 'all'
        layout = pk.layout_from_adapters(adapters, targets, args.max_rank, args.slots, dtype or "float32")
    tensors = pk.pack(adapters, layout)
    pk.write_pool(tensors, adapters, args.output)
    print(f"{args.output}: {len(adapters)} adapter(s) in {layout.num_slots} slots, rank {layout.max_rank}, "
          f"{len(layout.modules)} module(s)")
    return 0


def _run(args: argparse.Namespace) -> int:
    return {"inject": _inject, "decompose": _decompose, "pack": _pack}[args.sub](args)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
