"""``trtforge simulate``: replay a request trace against the KV-aware scheduler and print/save metrics."""

from __future__ import annotations

import math
from argparse import Namespace
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ._common import ArgumentParser, add_file_force, make_parser, run_command
from ._outputs import check_outputs

# the choices are plain data, repeated here so `--help` does not import the scheduler
POLICY_NAMES = ("trtllm-1.2-no-evict", "trtllm-main-no-evict", "max-utilization", "vllm-v1", "cache-aware",
                "fcfs-no-evict")
ROUTER_NAMES = ("round-robin", "prefix-affinity", "cache-aware")
_REDIS_POOL = 32  # the L2 client's smallest pool (scheduler/cache/entry.py refuses fewer)


_TRACE_HELP = "Azure .csv, Mooncake .jsonl, 'synthetic' or 'synthetic:N' (N from 1 to 200,000 requests, digits only)"


def build_parser() -> ArgumentParser:
    p = make_parser("trtforge simulate", "replay a trace (Azure CSV, Mooncake JSONL or synthetic) against the "
                                         "scheduler with a roofline step-time model of the profile's GPU")
    p.add_argument("--trace", required=True, help=_TRACE_HELP)
    p.add_argument("--profile", required=True, help="GPU profile (a10, a100, l40s, h100) or a .toml path")
    p.add_argument("--model", required=True, help="HF config.json or a preset (llama-3.1-8b, ...)")
    p.add_argument("--policy", required=True, choices=POLICY_NAMES,
                   help="admission policy (fcfs-no-evict is trtllm-1.2-no-evict's older name)")
    p.add_argument("--replicas", type=int, default=1, help="scheduler replicas (one GPU each; default 1); all "
                   f"replicas' KV blocks together at most {MAX_KV_BLOCKS:,} (lower --kv-scale for more)")
    p.add_argument("--router", choices=ROUTER_NAMES, default="round-robin",
                   help="how arrivals pick a replica (cache-aware: round-robin, except a request round-robin would "
                   "certainly serve past the TTFT SLO goes to a replica that starts it in time, longest cached prefix "
                   "first; exactly round-robin while prompt tokens arrive at least as fast as the replicas were seen "
                   "to work them off, the slowest replica's measured rate x replicas)")
    p.add_argument("--max-tokens", default="2048", metavar="{N,context,oracle}",
                   help="the cap clients send (max_tokens); requests stop at min(cap, the trace's output length), "
                        "and only the simulator knows the latter. Default 2048: above every output of the bundled "
                        "traces, so nothing is truncated and reservation pays for not knowing the length; "
                        "'context' = the rest of the model's context (servers' default when the client sends "
                        "none); 'oracle' = the true length (reservation that sees the future, comparison only)")
    p.add_argument("--slo-ttft", type=float, default=5.0,
                   help="goodput SLO on time to first token, seconds (default 5: a long Mooncake prompt's prefill "
                        "fits when it does not queue)")
    p.add_argument("--slo-tpot", type=float, default=0.1,
                   help="goodput SLO on time per output token, seconds (default 0.1 = 10 tokens/s)")
    p.add_argument("--lora-slots", type=int, default=8,
                   help="LoRA slot pool of the engine (default 8, trtforge lora inject's --slots default)")
    p.add_argument("--adapters", type=int, default=None, metavar="K",
                   help=f"give a trace without adapters K (1 to {MAX_ADAPTERS:,}) synthetic LoRA adapters, Zipf "
                        "popularity, seeded by --seed")
    p.add_argument("--max-requests", type=int, default=None,
                   help="replay only the first N requests (the N earliest arrivals)")
    p.add_argument("--kv-scale", type=float, default=1.0,
                   help="use this fraction of the planned KV blocks (e.g. 0.25 to create KV pressure)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival times (0.5 = twice the arrival rate)")
    p.add_argument("--max-running", type=int, default=256, help="max concurrent requests (default 256)")
    p.add_argument("--token-budget", "--max-num-tokens", type=int, default=8192,
                   help="tokens per step (default 8192); --max-num-tokens is the same option under trtforge kv-plan's "
                        "(and TensorRT-LLM's) name")
    p.add_argument("--horizon", type=float, default=600.0, help="seconds simulated past the last arrival (default 600)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic trace and of --adapters (default 0)")
    p.add_argument("--kv-dtype", choices=("fp16", "bf16", "fp8", "int8"), default=None,
                   help="KV cache dtype (default: the profile's precision); as trtforge kv-plan --kv-dtype")
    p.add_argument("--json", "--report", metavar="OUT", dest="json", default=None,
                   help="write the metrics JSON here (--report: the same option, as fold and precision spell it)")
    p.add_argument("--plot", metavar="OUT.png", default=None, help="write KV utilization / queue / TTFT plot")
    add_file_force(p)
    p.add_argument("--response-cache", metavar="TIERS", choices=("l1", "l1,l2", "l1,l2,l3"), default=None,
                   help="put the response cache in front (l1 | l1,l2 | l1,l2,l3): a repeat of an answered prompt "
                        "within the TTL is served by the tier holding it at that tier's lookup time, measured on "
                        "the real tiers at start-up; the trace is replayed with and without it. Prompts are known "
                        "only by block hashes: exact repeats are exact, semantic (L3) hits cannot be told apart "
                        "(reported as an upper bound). See README")
    p.add_argument("--redis-url", default=None, help="the L2 Redis for --response-cache l1,l2[,l3] "
                                                     "(redis://host:port/db; must answer at start-up)")
    p.add_argument("--redis-pool-size", type=int, default=None,
                   help=f"L2 connection pool size (>= {_REDIS_POOL}; default {_REDIS_POOL})")
    return p


#: Limits of one simulation, checked before anything is allocated (each replica and each KV block holds Python
#: objects, ~50 bytes a block: 10 million blocks, of all replicas together, stay within a few GiB).
MAX_REPLICAS = 1024
MAX_KV_BLOCKS = 10_000_000
MAX_RUNNING = 1_000_000
MAX_ADAPTERS = 1_000_000  # --adapters 10**8 held 10**8 weights and names (~16 GB)
MAX_TOKEN_BUDGET = 2**31 - 1
MAX_WINDOW_S = 2.0**42  # ~4.4e12 s: up to here a float time is exact to 2**-10 s (a step takes milliseconds)


def _check_sizes(args: Namespace) -> None:
    from ..core.errors import InputError

    for flag, value, high in (("--replicas", args.replicas, MAX_REPLICAS), ("--token-budget", args.token_budget,
                              MAX_TOKEN_BUDGET), ("--max-running", args.max_running, MAX_RUNNING)):
        if not 1 <= value <= high:
            raise InputError(f"{flag} {value}: give a whole number from 1 to {high}")


def _blocks(kv: Any, args: Namespace, profile: str) -> int:
    """One replica's KV blocks; refused when all replicas' blocks together exceed MAX_KV_BLOCKS, before any block pool
    (one entry a block, per replica) is made: 1024 replicas of the 2.3M-block example model were ~120 GB."""
    from ..core.errors import InputError

    blocks = max(1, math.floor(kv.num_blocks * args.kv_scale))
    n = args.replicas
    if blocks * n > MAX_KV_BLOCKS:
        # two significant digits, rounded DOWN: '.2g' rounded 0.0335 up to 0.034, which was refused again
        exact = MAX_KV_BLOCKS / (kv.num_blocks * n)
        step = 10.0 ** (math.floor(math.log10(exact)) - 1)
        each = f" x {n} replicas = {blocks * n}" if n > 1 else ""
        fewer = f", at most --replicas {MAX_KV_BLOCKS // blocks}," if n > 1 and blocks <= MAX_KV_BLOCKS else ""
        raise InputError(f"--model {args.model}: the KV plan gives {blocks} blocks of {kv.tokens_per_block} tokens on "
                         f"{profile}{each}, above the simulator's limit of {MAX_KV_BLOCKS} blocks; use --kv-scale "
                         f"{math.floor(exact / step) * step:.2g}{fewer} or a larger model config")
    return blocks


def _check(args: Namespace) -> None:
    """Every flag's range, before anything is read or written (exit 2 with the flag named)."""
    from ..core.errors import InputError
    from ._bounds import check_seed

    check_seed(args.seed)  # random.Random seeds with |seed|: --seed -1 replayed --seed 1's trace
    _check_sizes(args)
    if not 0 < args.kv_scale <= 1:
        raise InputError(f"--kv-scale must be in (0, 1], got {args.kv_scale}")
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise InputError(f"--time-scale must be a finite number > 0, got {args.time_scale}")
    if not (math.isfinite(args.horizon) and args.horizon >= 0):
        raise InputError(f"--horizon must be a finite number of seconds >= 0, got {args.horizon}")
    if args.max_requests is not None and args.max_requests < 1:
        raise InputError(f"--max-requests must be >= 1, got {args.max_requests}")
    for flag, v in (("--slo-ttft", args.slo_ttft), ("--slo-tpot", args.slo_tpot)):
        if not (math.isfinite(v) and v > 0):
            raise InputError(f"{flag} must be a finite number of seconds > 0, got {v}")
    if args.lora_slots < 0:
        raise InputError(f"--lora-slots must be >= 0, got {args.lora_slots}")
    if args.adapters is not None and not 1 <= args.adapters <= MAX_ADAPTERS:  # a popularity weight and name each
        raise InputError(f"--adapters {args.adapters}: give a whole number from 1 to {MAX_ADAPTERS}")
    _check_redis(args)
    # plain ASCII digits: str.isdigit() also holds for '\u00b2' (int() raised ValueError: exit 3) and '\u0663'
    # and no more digits than int() reads (4300: a 5000-digit cap raised ValueError, exit 3); any cap above the
    # model's context already rejects every request, so a longer one means nothing more
    cap = args.max_tokens
    if cap not in ("context", "oracle") and not (cap.isascii() and cap.isdigit() and len(cap) <= 4300 and int(cap)):
        raise InputError(f"--max-tokens {cap[:40]!r}{'...' * (len(cap) > 40)}: give a number >= 1 (at most 4300 "
                         "digits), 'context' or 'oracle'")


def _check_redis(args: Namespace) -> None:
    """``--redis-url`` / ``--redis-pool-size`` configure the L2 tier: without it they did nothing, silently."""
    from ..core.errors import InputError

    given = [f for f, v in (("--redis-url", args.redis_url), ("--redis-pool-size", args.redis_pool_size))
             if v is not None]
    if given and not (args.response_cache and "l2" in args.response_cache.split(",")):
        verb = "configure" if len(given) > 1 else "configures"
        raise InputError(f"{' and '.join(given)} {verb} the L2 tier, which this run does not use: add "
                         f"--response-cache l1,l2 (or l1,l2,l3), or drop {'them' if len(given) > 1 else 'it'}")
    if args.redis_pool_size is not None and args.redis_pool_size < _REDIS_POOL:
        raise InputError(f"--redis-pool-size {args.redis_pool_size}: use at least {_REDIS_POOL} connections")


def _check_span(reqs: Any, args: Namespace) -> None:
    """The window (the scaled arrivals and the horizon) stays where a float holds simulated milliseconds: past that
    a step's time rounds away, and past float's range a request arrived at infinity and was never submitted
    (--time-scale 1e308: exit 0, requests "unserved", every rate over an infinite window)."""
    from ..core.errors import InputError

    last = max(r.arrival for r in reqs)
    end = last + args.horizon
    if not math.isfinite(end) or end >= MAX_WINDOW_S:
        scaled = f" after --time-scale {args.time_scale:g}" if args.time_scale != 1.0 else ""
        raise InputError(f"{args.trace}: its last request arrives at {last:.3g} s{scaled}, so with --horizon "
                         f"{args.horizon:g} the simulated window ends past {MAX_WINDOW_S:.0e} s, where a float no "
                         "longer holds a step's milliseconds; fix the trace's timestamps (Mooncake's are "
                         "milliseconds), or give a smaller --time-scale or --horizon")


def _run(args: Namespace) -> int:
    from dataclasses import replace

    from trtforge.profiles.loader import load_profile
    from trtforge.scheduler.kv_plan import load_model_spec, plan_kv
    from trtforge.scheduler.scheduler import Scheduler, SchedulerConfig
    from trtforge.scheduler.sim.simulator import simulate
    from trtforge.scheduler.sim.step_time import StepTimeModel
    from trtforge.scheduler.sim.traces import assign_adapters, load_trace

    from ..core.fsutil import staged_json

    _check(args)
    from ._outputs import if_exists

    # Before simulating, and before either is written: neither may be the trace, the config or the profile.
    check_outputs(("--json", args.json), ("--plot", args.plot),
                  inputs=[("--trace", if_exists(args.trace)), ("--model", if_exists(args.model)),
                          ("--profile", if_exists(args.profile))])
    profile = load_profile(args.profile)
    spec = load_model_spec(args.model)
    kv = plan_kv(profile, spec, kv_dtype=args.kv_dtype, max_num_tokens=args.token_budget, max_batch=args.max_running)
    from .kv_plan import warn_unmodeled

    warn_unmodeled(args.model, spec, kv.weights_dtype, "the simulated KV capacity")
    reqs = load_trace(args.trace, args.max_requests, seed=args.seed)
    if args.time_scale != 1.0:
        reqs = [replace(r, arrival=r.arrival * args.time_scale) for r in reqs]
    _check_span(reqs, args)
    if args.adapters is not None:
        reqs = assign_adapters(reqs, args.adapters, seed=args.seed)
    adapters = tuple(sorted({r.adapter for r in reqs if r.adapter is not None}))
    blocks = _blocks(kv, args, profile.name)
    cfg = SchedulerConfig(num_blocks=blocks, tokens_per_block=kv.tokens_per_block, policy=args.policy,
                          max_seq_len=spec.max_seq_len, token_budget=args.token_budget,
                          max_running=args.max_running, lora_slots=args.lora_slots, adapters=adapters)
    model = StepTimeModel.from_profile(profile, spec, kv_dtype=kv.kv_dtype)
    res, cache_summary = _replay(args, reqs, partial(
        simulate, reqs, lambda: Scheduler(cfg), model, replicas=args.replicas, router=args.router,
        horizon_s=args.horizon, max_tokens=args.max_tokens, slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot))
    saved = {**res.summary.to_json(), "router": args.router, "trace": args.trace, "profile": profile.name,
             "model": spec.name, "kv_bytes_per_token": kv.kv_bytes_per_token, "kv_dtype": kv.kv_dtype,
             "kv_scale": args.kv_scale, "time_scale": args.time_scale,
             **({"response_cache": cache_summary} if cache_summary else {})}
    with staged_json(args.json, saved):  # --json and --plot are both written, or neither
        if args.plot:
            from trtforge.scheduler.sim.plots import plot_results

            plot_results([(f"{args.policy} x{args.replicas}", res)], args.plot)
    keys = ("policy", "goodput_req_s", "requests", "completed", "rejected", "preempted", "unserved", "req_per_s",
            "throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "kv_utilization_mean", "prefix_hit_rate",
            "adapter_loads", "slot_hits", "slot_wait_s")
    from ..core.jsonout import dumps

    shown = res.summary.to_json()  # a percentile of no requests (NaN) is null there: no value, as --json says
    _warn_unserved(res.summary, args.policy)
    print(dumps({**{k: shown[k] for k in keys},
                 **({"response_cache": cache_summary} if cache_summary else {})}, indent=1))
    return 0


def _warn_unserved(summary: Any, policy: str) -> None:
    """Requests still queued or running when the trace ended, said on stderr (a policy that never evicts blocked
    behind a request that does not fit: exit 0, 0 of 3 completed, and no word)."""
    if not summary.unserved:
        return
    from ..core.log import logger

    first = ", ".join(summary.stuck_ids[:3])
    logger("simulate").warning(f"{summary.unserved} of {summary.requests} request(s) were still queued or running "
                               f"when the trace ended (unserved; first: {first})" +
                               ("; this policy never evicts: its queue blocks behind a request that does not fit"
                                if "no-evict" in policy else ""))


def _replay(args: Namespace, reqs: Any, run: Callable[..., Any]) -> tuple[Any, dict[str, Any] | None]:
    """``run()`` once, or, with ``--response-cache``, measure the real tiers (exit 2 if the Redis does not answer)
    and run without and with the cache in front (scheduler/sim/response_cache.py)."""
    if not args.response_cache:
        return run(), None
    from trtforge.scheduler.sim.cache_costs import measure
    from trtforge.scheduler.sim.response_cache import parse_tiers, replay

    tiers = parse_tiers(args.response_cache)
    pool = _REDIS_POOL if args.redis_pool_size is None else args.redis_pool_size
    costs = measure(tiers, redis_url=args.redis_url, pool_size=pool)
    return replay(reqs, lambda front: run(front=front), tiers, costs)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
