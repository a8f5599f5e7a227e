"""Issue 11 "Exit codes and bounds" and "Messages" cases: bad values in files and flags, sizes that would exhaust
memory, and values a consumer (TensorRT, Triton, JSON) would refuse. Each is exit 2 with one line naming the
file or flag."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from . import fixtures as fx
from .cases_paths import Builder, Case, s

BOUND_CASES: dict[str, Builder] = {}
BIG = str(2**63 - 1)


def case(name: str):  # type: ignore[no-untyped-def]
    def register(fn: Builder) -> Builder:
        BOUND_CASES[name] = fn
        return fn
    return register


def _bad_offset(t: Path) -> Path:
    m = fx.external_model(t / "in.onnx")
    model = onnx.load(m, load_external_data=False)
    for e in model.graph.initializer[0].external_data:
        if e.key == "offset":
            e.value = "abc"
            break
    else:
        model.graph.initializer[0].external_data.add(key="offset", value="abc")
    onnx.save(model, m)
    return m


_OFFSET_ARGV = {
    "fold": lambda m, t: ["fold", s(m), "-o", s(t / "o.onnx")],
    "precision": lambda m, t: ["precision", s(m), "-o", s(t / "o.onnx"), "--to", "fp16"],
    "quantize": lambda m, t: ["quantize", s(m), "-o", s(t / "o.onnx"), "--mode", "int8"],
    "lora inject": lambda m, t: ["lora", "inject", s(m), "-o", s(t / "o.onnx"), "--targets", "q_proj"],
    "lora decompose": lambda m, t: ["lora", "decompose", s(m), "-o", s(t / "o.onnx")],
    "build": lambda m, t: ["build", s(m), "--profile", "a100", "-o", s(t / "eng")],
    "diff": lambda m, t: ["diff", s(m), s(m)],
}


def _offset_case(cmd: str) -> Builder:
    def build(t: Path) -> Case:
        m = _bad_offset(t)
        return Case(_OFFSET_ARGV[cmd](m, t), ("in.onnx", "offset"))
    return build


for _cmd in _OFFSET_ARGV:
    BOUND_CASES[f"{_cmd}: external data offset 'abc'"] = _offset_case(_cmd)


@case("fold --check --seed -1")
def _fold_seed(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    return Case(["fold", s(m), "-o", s(t / "o.onnx"), "--check", "--seed", "-1"], ("--seed",))


def _sim(trace: str, *more: str, model: str = "llama-3.1-8b") -> list[str]:
    return ["simulate", "--trace", trace, "--profile", "a100", "--model", model, "--policy", "cache-aware", *more]


@case("trace input_length Infinity")
def _trace_inf(t: Path) -> Case:
    tr = t / "trace.jsonl"
    tr.write_text('{"timestamp": 0, "input_length": Infinity, "output_length": 4, "hash_ids": []}\n')
    return Case(_sim(s(tr)), ("trace.jsonl", "input_length"))


def _hf_case(key: str, value: object) -> Builder:
    def build(t: Path) -> Case:
        c = fx.hf_config(t / "config.json", **{key: value})
        return Case(["kv-plan", "--profile", "a100", "--model", s(c)], ("config.json", key))
    return build


for _key, _value in (("max_position_embeddings", "4096"), ("max_position_embeddings", [4096]),
                     ("max_position_embeddings", float("inf")), ("vocab_size", 1e400)):
    BOUND_CASES[f"config {_key} {json.dumps(_value)}"] = _hf_case(_key, _value)


def _adapter_case(what: str, **cfg: object) -> Builder:
    def build(t: Path) -> Case:
        a = fx.adapter(t / "ad", config=cfg)
        return Case(["lora", "pack", s(a), "--targets", "q_proj", "-o", s(t / "pool.safetensors")],
                    ("adapter_config.json", what))
    return build


for _name, _cfg in (("target_modules", {"target_modules": 5}), ("lora_alpha", {"lora_alpha": float("nan")}),
                    ("lora_alpha", {"lora_alpha": float("inf")}), ("r", {"r": 8.7})):
    BOUND_CASES[f"adapter {_name} {json.dumps(next(iter(_cfg.values())))}"] = _adapter_case(_name, **_cfg)


@case("safetensors header is a JSON list")
def _st_list(t: Path) -> Case:
    a = fx.adapter(t / "ad", header=b"[1, 2, 3]")
    return Case(["lora", "pack", s(a), "--targets", "q_proj", "-o", s(t / "pool.safetensors")],
                ("adapter_model.safetensors",))


def _profile_case(old: str, new: str, what: str) -> Builder:
    def build(t: Path) -> Case:
        m = fx.tiny_model(t / "in.onnx")
        p = fx.profile(t / "p.toml", (old, new))
        return Case(["build", s(m), "--profile", s(p), "-o", s(t / "eng")], ("p.toml", what))
    return build


BOUND_CASES["profile workspace_mb 2^63-1"] = _profile_case("workspace_mb = ", f"workspace_mb = {BIG} #", "workspace_mb")
BOUND_CASES["profile sequence.max 2^63-1"] = _profile_case("sequence = { min = 1, opt = 1, max = ",
                                                           f"sequence = {{ min = 1, opt = 1, max = {BIG} }} #",
                                                           "max")


@case("build: a model TensorRT cannot parse")
def _unparsable(t: Path) -> Case:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"], domain="my.domain")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = t / "in.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("my.domain", 1)]), m)
    return Case(["build", s(m), "--profile", "a100", "-o", s(t / "eng")], ("in.onnx",))


@case("build: opset 99")
def _opset99(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx", opset=99)
    return Case(["build", s(m), "--profile", "a100", "-o", s(t / "eng")], ("in.onnx", "99"))


def _triton(t: Path, *more: str) -> list[str]:
    fx.engine(t / "eng")
    return ["triton", s(t / "eng"), "--repo", s(t / "repo"), "--name", "m", *more]


@case("triton --instances 99999999999")
def _instances(t: Path) -> Case:
    return Case(_triton(t, "--instances", "99999999999"), ("--instances",))


@case("triton --version 99999999999999999999")
def _version(t: Path) -> Case:
    return Case(_triton(t, "--version", "99999999999999999999"), ("--version",))


def _manifest_case(edit, what: str) -> Builder:  # type: ignore[no-untyped-def]
    def build(t: Path) -> Case:
        argv = _triton(t)
        path = t / "eng" / "manifest.json"
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))
        return Case(argv, ("manifest.json", what))
    return build


def _huge_dims(d: dict) -> None:
    for p in d["inputs"][0]["profiles"]:
        p["max"] = [2**62, 2**62]


def _many_profiles(d: dict) -> None:
    d["optimization_profiles"] = 10**9


BOUND_CASES["manifest dims 2^62"] = _manifest_case(_huge_dims, "max")
BOUND_CASES["manifest 1e9 optimization profiles"] = _manifest_case(_many_profiles, "optimization_profiles")


@case("simulate --trace synthetic:100000000000")
def _synthetic(t: Path) -> Case:
    return Case(_sim("synthetic:100000000000"), ("--trace",))


@case("simulate --replicas 100000")
def _replicas(t: Path) -> Case:
    return Case(_sim("synthetic:4", "--replicas", "100000"), ("--replicas",))


@case("simulate: a tiny-KV config giving ~3e8 blocks")
def _tiny_kv(t: Path) -> Case:
    c = fx.hf_config(t / "config.json", num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                     hidden_size=1, head_dim=1, intermediate_size=1, vocab_size=1)
    return Case(_sim("synthetic:4", model=s(c)), ("config.json", "blocks"))


@case("lora pack --slots 1e8")
def _slots(t: Path) -> Case:
    a = fx.adapter(t / "ad")
    return Case(["lora", "pack", s(a), "--targets", "q_proj", "--slots", "100000000", "-o",
                 s(t / "pool.safetensors")], ("--slots",))


@case("diff --shape x:0,16")
def _shape0(t: Path) -> Case:
    m = fx.tiny_model(t / "a.onnx")
    return Case(["diff", s(m), s(m), "--shape", "x:0,16"], ("--shape",))


@case("simulate --token-budget 0")
def _budget(t: Path) -> Case:
    return Case(_sim("synthetic:4", "--token-budget", "0"), ("--token-budget",))


@case("simulate --token-budget 1 (below --max-running)")
def _sim_budget_below_running(t: Path) -> Case:
    return Case(_sim("synthetic:4", "--token-budget", "1"), ("--token-budget", "--max-running"))


@case("diff --seed -5")
def _diff_seed(t: Path) -> Case:
    m = fx.tiny_model(t / "a.onnx")
    return Case(["diff", s(m), s(m), "--seed", "-5"], ("--seed",))


@case("simulate --seed -1")
def _sim_seed(t: Path) -> Case:
    # random.Random takes |seed|: -1 silently replayed --seed 1's synthetic trace (every other command refuses it)
    return Case(_sim("synthetic:10", "--seed", "-1"), ("--seed",))
