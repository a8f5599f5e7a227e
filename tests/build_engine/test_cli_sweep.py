"""Bad usage of every command (the contract in build_engine/cli/_common.py):
exit 2, one ``error:`` line naming the culprit, no traceback,
nothing left behind -- missing arguments, wrong types, nonexistent inputs, outputs in missing folders or on folders,
and a bad second output path after a good first one (the first must not be written)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error, seeded_rng


@dataclass(frozen=True)
class Paths:
    tiny: Path  # a valid MatMul model
    llama: Path  # the example Llama (one layer), for lora inject
    file: Path  # an existing plain file
    folder: Path  # an existing empty folder
    missing: Path  # does not exist
    nodir: Path  # a folder that does not exist (outputs below it)
    trace: Path  # a one-request Mooncake trace
    out: Path  # the test's own output folder (starts empty)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from trtforge.examples.llama import LlamaConfig, make_llama

    d = tmp_path_factory.mktemp("sweep_inputs")
    w = numpy_helper.from_array(seeded_rng("test_cli_sweep.inputs").standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), d / "tiny.onnx")
    onnx.save(make_llama(LlamaConfig(layers=1)), d / "llama.onnx")
    (d / "notes.txt").write_text("not a model\n")
    (d / "trace.jsonl").write_text(json.dumps({"timestamp": 0, "input_length": 40, "output_length": 5}) + "\n")
    return {"tiny": d / "tiny.onnx", "llama": d / "llama.onnx", "file": d / "notes.txt", "trace": d / "trace.jsonl"}


@pytest.fixture
def paths(inputs: dict[str, Path], tmp_path: Path) -> Paths:
    (tmp_path / "folder").mkdir()
    (tmp_path / "out").mkdir()
    return Paths(folder=tmp_path / "folder", missing=tmp_path / "missing.onnx", nodir=tmp_path / "no" / "such",
                 out=tmp_path / "out", **inputs)


SIM = ["--profile", "h100", "--model", "llama-3.1-8b", "--policy", "cache-aware"]
KV = ["kv-plan", "--profile", "h100", "--model", "llama-3.1-8b"]

# id -> (argv from the paths, a text the error line must contain)
CASES: dict[str, tuple[Callable[[Paths], list[object]], str]] = {
    # fold
    "fold/no-args": (lambda p: ["fold"], "required"),
    "fold/no-output": (lambda p: ["fold", p.tiny], "-o/--output"),
    "fold/missing-input": (lambda p: ["fold", p.missing, "-o", p.out / "o.onnx"], "missing.onnx"),
    "fold/input-is-folder": (lambda p: ["fold", p.folder, "-o", p.out / "o.onnx"], "folder"),
    "fold/output-in-missing-folder": (lambda p: ["fold", p.tiny, "-o", p.nodir / "o.onnx"], "does not exist"),
    "fold/output-is-folder": (lambda p: ["fold", p.tiny, "-o", p.folder], "is a folder"),
    "fold/report-is-folder": (lambda p: ["fold", p.tiny, "-o", p.out / "o.onnx", "--report", p.folder],
                              "is a folder"),
    "fold/report-in-missing-folder": (lambda p: ["fold", p.tiny, "-o", p.out / "o.onnx", "--report",
                                                 p.nodir / "r.json"], "does not exist"),
    "fold/seed-not-int": (lambda p: ["fold", p.tiny, "-o", p.out / "o.onnx", "--seed", "x"], "--seed"),
    # precision
    "precision/no-to": (lambda p: ["precision", p.tiny, "-o", p.out / "o.onnx"], "--to"),
    "precision/bad-to": (lambda p: ["precision", p.tiny, "-o", p.out / "o.onnx", "--to", "fp8"], "--to"),
    "precision/missing-input": (lambda p: ["precision", p.missing, "-o", p.out / "o.onnx", "--to", "fp16"],
                                "missing.onnx"),
    "precision/output-is-folder": (lambda p: ["precision", p.tiny, "-o", p.folder, "--to", "fp16"], "is a folder"),
    "precision/report-is-folder": (lambda p: ["precision", p.tiny, "-o", p.out / "o.onnx", "--to", "fp16",
                                              "--report", p.folder], "is a folder"),
    "precision/report-is-output": (lambda p: ["precision", p.tiny, "-o", p.out / "o.onnx", "--to", "fp16",
                                              "--report", p.out / "o.onnx"], "same file"),
    # lora
    "lora/no-subcommand": (lambda p: ["lora"], "required"),
    "lora/inject-no-targets": (lambda p: ["lora", "inject", p.llama, "-o", p.out / "o.onnx"], "--targets"),
    "lora/inject-rank-not-int": (lambda p: ["lora", "inject", p.llama, "-o", p.out / "o.onnx", "--targets",
                                            "q_proj", "--max-rank", "x"], "--max-rank"),
    "lora/inject-rank-0": (lambda p: ["lora", "inject", p.llama, "-o", p.out / "o.onnx", "--targets", "q_proj",
                                      "--max-rank", "0"], "max_rank"),
    "lora/inject-slots-negative": (lambda p: ["lora", "inject", p.llama, "-o", p.out / "o.onnx", "--targets",
                                              "q_proj", "--slots", "-3"], "num_slots"),
    "lora/inject-output-in-missing-folder": (lambda p: ["lora", "inject", p.llama, "-o", p.nodir / "o.onnx",
                                                        "--targets", "q_proj"], "does not exist"),
    "lora/decompose-missing-input": (lambda p: ["lora", "decompose", p.missing, "-o", p.out / "o.onnx"],
                                     "missing.onnx"),
    "lora/decompose-no-plugin": (lambda p: ["lora", "decompose", p.llama, "-o", p.out / "o.onnx"],
                                 "no LoRAOpPluginDynamic"),
    "lora/pack-missing-adapter": (lambda p: ["lora", "pack", p.missing, "-o", p.out / "p.safetensors"],
                                  "adapter_config.json"),
    "lora/inject-empty-targets": (lambda p: ["lora", "inject", p.llama, "-o", p.out / "o.onnx", "--targets", " , "],
                                  "--targets"),
    "lora/pack-model-and-targets": (lambda p: ["lora", "pack", p.folder, "--model", p.tiny, "--targets", "q_proj",
                                               "-o", p.out / "p.safetensors"], "not allowed"),
    # profiles / backends
    "profiles/unknown": (lambda p: ["profiles", "no-such-gpu"], "no-such-gpu"),
    "profiles/missing-toml": (lambda p: ["profiles", p.nodir / "x.toml"], "x.toml"),
    "profiles/not-toml": (lambda p: ["profiles", p.file], "notes.txt"),
    "profiles/folder": (lambda p: ["profiles", p.folder], "is a folder"),
    "backends/extra-argument": (lambda p: ["backends", "x"], "unrecognized"),
    # build (all refused before TensorRT is touched)
    "build/no-profile": (lambda p: ["build", p.tiny, "-o", p.out / "e"], "--profile"),
    "build/unknown-profile": (lambda p: ["build", p.tiny, "--profile", "no-such-gpu", "-o", p.out / "e"],
                              "no-such-gpu"),
    "build/missing-input": (lambda p: ["build", p.missing, "--profile", "a100", "-o", p.out / "e"], "missing.onnx"),
    "build/output-is-file": (lambda p: ["build", p.tiny, "--profile", "a100", "-o", p.file], "notes.txt"),
    "build/output-exists": (lambda p: ["build", p.tiny, "--profile", "a100", "-o", p.folder], "--force"),
    "build/output-in-missing-folder": (lambda p: ["build", p.tiny, "--profile", "a100", "-o", p.nodir / "e"],
                                       "does not exist"),
    "build/bad-backend": (lambda p: ["build", p.tiny, "--profile", "a100", "-o", p.out / "e", "--backend", "x"],
                          "--backend"),
    # kv-plan
    "kv-plan/no-model": (lambda p: ["kv-plan", "--profile", "h100"], "--model"),
    "kv-plan/missing-config": (lambda p: ["kv-plan", "--profile", "h100", "--model", p.nodir / "config.json"],
                               "config.json"),
    "kv-plan/config-folder-without-config": (lambda p: ["kv-plan", "--profile", "h100", "--model", p.folder],
                                             "without config.json"),
    "kv-plan/tp-0": (lambda p: [*KV, "--tp", "0"], "--tp"),
    "kv-plan/tp-not-int": (lambda p: [*KV, "--tp", "x"], "--tp"),
    "kv-plan/max-num-tokens-0": (lambda p: [*KV, "--max-num-tokens", "0"], "--max-num-tokens"),
    "kv-plan/json-is-folder": (lambda p: [*KV, "--json", p.folder], "is a folder"),
    "kv-plan/json-in-missing-folder": (lambda p: [*KV, "--json", p.nodir / "k.json"], "does not exist"),
    # triton (no engine needed to refuse these)
    "triton/no-args": (lambda p: ["triton"], "--repo"),
    "triton/engine-missing": (lambda p: ["triton", p.missing, "--repo", p.out / "repo", "--name", "m"],
                              "not an engine folder"),
    "triton/not-an-engine": (lambda p: ["triton", p.folder, "--repo", p.out / "repo", "--name", "m"],
                             "manifest.json"),
    "triton/check-missing": (lambda p: ["triton", "--check", p.missing], "not a folder"),
    "triton/version-0": (lambda p: ["triton", p.folder, "--repo", p.out / "repo", "--name", "m", "--version", "0"],
                         "--version"),
    # diff
    "diff/one-model": (lambda p: ["diff", p.tiny], "required"),
    "diff/missing-model": (lambda p: ["diff", p.tiny, p.missing], "missing.onnx"),
    "diff/atol-negative": (lambda p: ["diff", p.tiny, p.tiny, "--atol", "-1"], "--atol"),
    "diff/bad-shape": (lambda p: ["diff", p.tiny, p.tiny, "--shape", "x"], "--shape"),
    "diff/save-is-folder": (lambda p: ["diff", p.tiny, p.tiny, "--save", p.folder], "is a folder"),
    "diff/save-in-missing-folder": (lambda p: ["diff", p.tiny, p.tiny, "--save", p.nodir / "r.json"],
                                    "does not exist"),
    "diff/save-over-a-model": (lambda p: ["diff", p.tiny, p.tiny, "--save", p.tiny], "overwrite"),
    # simulate
    "simulate/no-args": (lambda p: ["simulate"], "required"),
    "simulate/missing-trace": (lambda p: ["simulate", "--trace", p.nodir / "t.jsonl", *SIM], "t.jsonl"),
    "simulate/replicas-0": (lambda p: ["simulate", "--trace", p.trace, *SIM, "--replicas", "0"], "--replicas"),
    "simulate/horizon-negative": (lambda p: ["simulate", "--trace", p.trace, *SIM, "--horizon", "-1"], "--horizon"),
    "simulate/time-scale-inf": (lambda p: ["simulate", "--trace", p.trace, *SIM, "--time-scale", "inf"],
                                "--time-scale"),
    "simulate/kv-scale-nan": (lambda p: ["simulate", "--trace", p.trace, *SIM, "--kv-scale", "nan"], "--kv-scale"),
    "simulate/json-is-folder": (lambda p: ["simulate", "--trace", p.trace, *SIM, "--json", p.folder],
                                "is a folder"),
    "simulate/plot-in-missing-folder-after-good-json": (
        lambda p: ["simulate", "--trace", p.trace, *SIM, "--json", p.out / "s.json", "--plot", p.nodir / "p.png"],
        "does not exist"),
    # demo
    "demo/workdir-is-file": (lambda p: ["demo", "--workdir", p.file], "notes.txt"),
}


def _tree(root: Path) -> set[Path]:
    return set(root.rglob("*"))


@pytest.mark.parametrize("case", list(CASES))
def test_bad_usage_is_exit_2_one_line_nothing_left(cli, paths: Paths, tmp_path: Path, case: str) -> None:
    argv, needle = CASES[case]
    before = _tree(tmp_path) | _tree(paths.tiny.parent)
    res = cli(*argv(paths))
    assert_one_line_error(res, 2, needle)
    assert _tree(tmp_path) | _tree(paths.tiny.parent) == before, "an output was left behind"


@pytest.fixture(scope="module")
def engine(inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real TensorRT-RTX engine of the tiny model (well under a second to build)."""
    pytest.importorskip("tensorrt_rtx")
    from trtforge.build_engine.cli import main

    out = tmp_path_factory.mktemp("sweep_engine") / "eng"
    assert main(["build", str(inputs["tiny"]), "--profile", "a100", "-o", str(out), "--no-progress"]) == 0
    return out


ENGINE_CASES: dict[str, tuple[Callable[[Paths, Path], list[object]], str]] = {
    "repo-is-file": (lambda p, e: ["triton", e, "--repo", p.file, "--name", "m"], "--repo"),
    "repo-in-missing-folder": (lambda p, e: ["triton", e, "--repo", p.nodir / "repo", "--name", "m"],
                               "does not exist"),
    "name-escapes": (lambda p, e: ["triton", e, "--repo", p.out / "repo", "--name", "../m"], "--name"),
    "max-batch-negative": (lambda p, e: ["triton", e, "--repo", p.out / "repo", "--name", "m", "--max-batch", "-1"],
                           "--max-batch"),
    "instances-0": (lambda p, e: ["triton", e, "--repo", p.out / "repo", "--name", "m", "--instances", "0"],
                    "--instances"),
    "diff-two-engines": (lambda p, e: ["diff", e, e], "engine folders"),
}


@pytest.mark.parametrize("case", list(ENGINE_CASES))
def test_bad_usage_with_an_engine(cli, paths: Paths, engine: Path, tmp_path: Path, case: str) -> None:
    argv, needle = ENGINE_CASES[case]
    before = _tree(tmp_path) | _tree(engine)
    res = cli(*argv(paths, engine))
    assert_one_line_error(res, 2, needle)
    assert _tree(tmp_path) | _tree(engine) == before, "an output was left behind"


def test_pack_empty_targets_is_refused_not_read_as_all(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    """``--targets ''`` used to pack every module (an empty string read as 'no filter')."""
    st = pytest.importorskip("safetensors.numpy")
    g = rng
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    st.save_file({f"{prefix}.lora_A.weight": g.standard_normal((4, 256)).astype(np.float32),
                  f"{prefix}.lora_B.weight": g.standard_normal((256, 4)).astype(np.float32)},
                 str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "peft_type": "LORA",
                                                             "target_modules": ["q_proj"]}))
    out = tmp_path / "pool.safetensors"
    assert_one_line_error(cli("lora", "pack", adapter, "--targets", "", "-o", out), 2, "--targets")
    assert not out.exists()
    assert cli("lora", "pack", adapter, "--targets", "q_proj", "-o", out).code == 0 and out.stat().st_size > 0
