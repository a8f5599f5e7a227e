"""``trtforge kv-plan``: KV-cache capacity (blocks, tokens, concurrent requests) of a decoder on a GPU profile."""

from __future__ import annotations

import json
from argparse import Namespace
from collections.abc import Sequence
from typing import Any

from ._common import ArgumentParser, add_file_force, make_parser, run_command


def build_parser() -> ArgumentParser:
    p = make_parser("trtforge kv-plan", "KV-cache capacity of a decoder on a GPU profile (TensorRT-LLM's formula "
                                        "family: free memory after weights and activations x fraction / block)")
    p.add_argument("--profile", required=True, help="GPU profile name (a10, a100, l40s, h100) or a .toml path")
    p.add_argument("--model", required=True, help="HF config.json path or a preset (llama-3.1-8b, llama-3.1-70b, "
                                                  "mistral-7b)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per replica (default 1)")
    p.add_argument("--kv-dtype", choices=("fp16", "bf16", "fp8", "int8"), default=None,
                   help="KV cache dtype (default: the profile's precision); fp8 and int8 hold half the bytes per "
                        "token of fp16/bf16; fp8 only on profiles that allow it (compute capability >= 8.9)")
    p.add_argument("--request-tokens", type=int, default=None,
                   help="prompt + generated tokens of one request, for 'requests that fit' (default 4096, or the "
                        "model's context if shorter; more than the context is refused)")
    p.add_argument("--max-num-tokens", type=int, default=8192,
                   help="tokens in the largest forward (sizes the activation reserve; default 8192)")
    p.add_argument("--json", "--report", metavar="OUT", dest="json", default=None,
                   help="also write the plan as JSON (--report: the same option, as fold and precision spell it)")
    add_file_force(p)
    return p


def warn_unmodeled(model: str, spec: Any, weights_dtype: str, capacity: str) -> None:
    """What the KV plan of ``model`` leaves out (``spec.unmodeled``: a sliding window planned as full attention, a
    vision tower not counted, ...; a quantization_config it does not model), as warnings; ``capacity`` names the
    figure that is then a bound ("the KV capacity above", "the simulated KV capacity")."""
    from ..core.log import logger

    if spec.unmodeled:
        logger("kv_plan").warning(f"{model}: {spec.unmodeled}")
    if spec.quantization and spec.weight_quant is None:
        logger("kv_plan").warning(f"{model} has a quantization_config ({spec.quantization}) that kv-plan does not "
                                  f"model: the weights are sized as {weights_dtype}, so {capacity} is a lower bound")


def _run(args: Namespace) -> int:
    from trtforge.profiles.loader import load_profile
    from trtforge.scheduler.kv_plan import GIB, load_model_spec, plan_kv

    from ..core.fsutil import write_json
    from ._outputs import check_outputs, if_exists

    check_outputs(("--json", args.json),
                  inputs=[("--model", if_exists(args.model)), ("--profile", if_exists(args.profile))])
    profile = load_profile(args.profile)
    spec = load_model_spec(args.model)
    plan = plan_kv(profile, spec, tp=args.tp, kv_dtype=args.kv_dtype, request_tokens=args.request_tokens,
                   max_num_tokens=args.max_num_tokens)
    if args.json:
        write_json(args.json, plan.to_json())
    print(f"model {plan.model} ({plan.num_params / 1e9:.2f} B params) on {plan.profile}, tp={plan.tp}")
    sized = (f"{plan.weights_quantization} projections, {plan.weights_dtype} others" if plan.weights_quantization
             else plan.weights_dtype)
    print(f"  weights        {plan.weights_bytes / GIB:8.2f} GiB per GPU ({sized})")
    print(f"  activations    {plan.activation_bytes / GIB:8.2f} GiB + reserve {plan.reserve_bytes / GIB:.2f} GiB")
    print(f"  free           {plan.free_bytes / GIB:8.2f} GiB x {plan.memory_fraction} -> KV "
          f"{plan.kv_cache_bytes / GIB:.2f} GiB")
    print(f"  KV per token   {plan.kv_bytes_per_token} bytes ({plan.kv_dtype}); block = {plan.tokens_per_block} "
          f"tokens = {plan.bytes_per_block} bytes")
    print(f"  blocks         {plan.num_blocks}  ->  max tokens {plan.max_tokens}")
    print(f"  requests of {plan.request_tokens} tokens that fit at once: {plan.requests_that_fit} (context "
          f"{plan.max_seq_len} tokens)")
    warn_unmodeled(args.model, spec, plan.weights_dtype, "the KV capacity above")
    if args.json:
        print(json.dumps({"json": args.json}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
