"""Real TensorRT-RTX engine builds of the example Llama for the a10 and a100 profiles, and the build's bad inputs.

Deserializing or running the engines needs a GPU that TensorRT-RTX supports (not Hopper); this machine has none,
so the plans are checked through the manifest, their sha256 and the converted ONNX kept beside them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtforge.build_engine.engine.builder import BuildTimings, build_engine
from trtforge.build_engine.engine.manifest import Manifest
from trtforge.examples.llama import LlamaConfig, make_llama
from trtforge.profiles.loader import load_profile
from trtforge_testing import assert_one_line_error

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None,
                                reason="tensorrt_rtx not installed")
HAS_TRT = importlib.util.find_spec("tensorrt") is not None
T = onnx.TensorProto
MANIFEST_KEYS = ["format", "plan", "backend", "profile", "precision", "compute_capabilities", "inputs", "outputs",
                 "optimization_profiles", "plugins", "onnx_sha256", "plan_sha256", "build_seconds"]
DTYPE = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from trtforge.build_engine.precision.convert import convert_precision

    folder = tmp_path_factory.mktemp("models")
    fp32 = make_llama(seed=7)
    paths = {"fp32": folder / "llama.onnx", "bf16": folder / "llama_bf16.onnx"}
    onnx.save(fp32, paths["fp32"])
    onnx.save(convert_precision(fp32, "bf16").model, paths["bf16"])
    return paths


@pytest.fixture(scope="module")
def built(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    out = {}
    for profile in ("a10", "a100"):
        for variant in ("fp32", "bf16"):
            d = tmp_path_factory.mktemp("engines") / f"{profile}_{variant}"
            timings = BuildTimings()
            build_engine(models[variant], profile, d, progress=False, timings=timings)
            assert timings.steps["build"] > 0
            out[(profile, variant)] = d
    return out


@pytest.mark.parametrize("profile_name", ["a10", "a100"])
@pytest.mark.parametrize("variant", ["fp32", "bf16"])
def test_engine_and_manifest(built: dict, models: dict, profile_name: str, variant: str) -> None:
    import tensorrt_rtx

    d = built[(profile_name, variant)]
    profile = load_profile(profile_name)
    manifest = json.loads((d / "manifest.json").read_text())
    assert list(manifest) == MANIFEST_KEYS
    assert Manifest.load(d).to_json() == manifest  # the typed manifest reads back exactly what the build wrote
    plan = (d / "model.plan").read_bytes()
    assert len(plan) > 100_000  # weights alone are ~3.8 MB in fp32 / ~1.9 MB in 16 bit
    assert hashlib.sha256(plan).hexdigest() == manifest["plan_sha256"]
    assert hashlib.sha256(models[variant].read_bytes()).hexdigest() == manifest["onnx_sha256"]
    assert manifest["format"] == 1 and manifest["plan"] == "model.plan"
    assert manifest["backend"] == {"name": "tensorrt_rtx", "version": tensorrt_rtx.__version__}
    # A model that is already 16-bit keeps its type (bf16 on a10: A10 runs bf16; no double rounding to fp16).
    precision = variant if variant != "fp32" else profile.precision.dtype
    assert manifest["profile"] == profile.name and manifest["precision"] == precision
    assert manifest["compute_capabilities"] == [profile.hardware.compute_capability]
    assert manifest["optimization_profiles"] == len(profile.shapes)
    assert manifest["plugins"] == [] and manifest["build_seconds"] > 0
    # Inputs/outputs against the source model and the profile's ranges.
    src = onnx.load(models[variant])
    assert [i["name"] for i in manifest["inputs"]] == [i.name for i in src.graph.input]
    (inp,) = manifest["inputs"]
    assert inp["dtype"] == "int64" and inp["shape"] == [-1, -1]
    expected = [{"min": [s.batch.min, s.sequence.min], "opt": [s.batch.opt, s.sequence.opt],
                 "max": [s.batch.max, s.sequence.max]} for s in profile.shapes]
    assert inp["profiles"] == expected
    assert inp["min"] == [min(p["min"][k] for p in expected) for k in range(2)]
    assert inp["max"] == [max(p["max"][k] for p in expected) for k in range(2)]
    assert inp["opt"] == expected[0]["opt"]
    (out,) = manifest["outputs"]
    assert out == {"name": src.graph.output[0].name, "dtype": "float32", "shape": [-1, -1, LlamaConfig().vocab]}
    # The ONNX that was built is kept: projections in the profile's precision, fp32 I/O.
    kept = onnx.load(d / "model.onnx")
    types = {t.name: t.data_type for t in kept.graph.initializer}
    q = next(n for n in kept.graph.node if n.name == "/model/layers.0/self_attn/q_proj/MatMul")
    assert types[q.input[1]] == DTYPE[precision]
    assert kept.graph.output[0].type.tensor_type.elem_type == T.FLOAT


def test_engines_per_target_and_deterministic(built: dict) -> None:
    """a10 and a100 plans differ; on a100 the fp32 model converted by the builder gives the very same plan as the
    model converted beforehand by ``precision`` (conversion + fold are deterministic and idempotent)."""
    sha = {k: json.loads((d / "manifest.json").read_text())["plan_sha256"] for k, d in built.items()}
    assert sha[("a10", "fp32")] != sha[("a100", "fp32")]
    assert sha[("a10", "bf16")] != sha[("a100", "bf16")]
    assert sha[("a100", "fp32")] == sha[("a100", "bf16")]


def test_cli_build_and_force(cli, models: dict, tmp_path: Path) -> None:
    out = tmp_path / "engine"
    res = cli("build", models["bf16"], "--profile", "a100", "-o", out, "--no-progress")
    assert res.code == 0, res.err
    assert "tensorrt_rtx" in res.out and (out / "model.plan").exists()
    first = json.loads((out / "manifest.json").read_text())
    again = cli("build", models["bf16"], "--profile", "a100", "-o", out)
    assert_one_line_error(again, 2, str(out), "--force")
    assert json.loads((out / "manifest.json").read_text()) == first  # untouched
    forced = cli("build", models["fp32"], "--profile", "a10", "-o", out, "--force", "--no-progress")
    assert forced.code == 0, forced.err
    assert json.loads((out / "manifest.json").read_text())["profile"] == "a10"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]  # no temporary folders left


def test_unknown_profile(cli, models: dict, tmp_path: Path) -> None:
    res = cli("build", models["fp32"], "--profile", "a200", "-o", tmp_path / "e")
    assert_one_line_error(res, 2, "a200")
    assert not (tmp_path / "e").exists()


def test_misspelled_profile_key(cli, models: dict, tmp_path: Path) -> None:
    text = Path(load_profile("a10").source).read_text()
    assert "optimization_level" in text
    bad = tmp_path / "mine.toml"
    bad.write_text(text.replace("optimization_level", "optimisation_level", 1))
    res = cli("build", models["fp32"], "--profile", bad, "-o", tmp_path / "e")
    assert_one_line_error(res, 2, "optimisation_level", "optimization_level")
    assert not (tmp_path / "e").exists()


def _with_input_dims(src: Path, dst: Path, dims: list[int | str]) -> Path:
    model = onnx.load(src)
    shape = model.graph.input[0].type.tensor_type.shape
    for d, value in zip(shape.dim, dims, strict=True):
        if isinstance(value, int):
            d.dim_value = value
        else:
            d.dim_param = value
    onnx.save(model, dst)
    return dst


@pytest.mark.parametrize(("dims", "needles"), [
    ([3, "sequence"], ("static batch of 3", "4..8")),
    (["batch", 4], ("static sequence of 4", "8..64")),
])
def test_static_dims_outside_ranges(cli, models: dict, tmp_path: Path, dims: list, needles: tuple) -> None:
    """A custom profile whose ranges exclude the model's static batch (3) or sequence (4) is refused."""
    import re

    text = Path(load_profile("a10").source).read_text()
    profile = tmp_path / "p.toml"
    # Ranges that cannot take batch 3 or sequence 4: batch 4..8, sequence 8..64 in every shape profile.
    text = re.sub(r"batch = \{[^}]*\}", "batch = { min = 4, opt = 4, max = 8 }", text)
    text = re.sub(r"sequence = \{[^}]*\}", "sequence = { min = 8, opt = 16, max = 64 }", text)
    profile.write_text(text)
    model = _with_input_dims(models["fp32"], tmp_path / "static.onnx", dims)
    res = cli("build", model, "--profile", profile, "-o", tmp_path / "e")
    assert_one_line_error(res, 2, *needles, "input_ids")
    assert not (tmp_path / "e").exists()


def test_unrecognised_dynamic_axis(cli, models: dict, tmp_path: Path) -> None:
    """A float input with a dynamic dim that is neither batch nor sequence cannot take the profile's ranges."""
    model = onnx.load(models["fp32"])
    model.graph.input.append(onnx.helper.make_tensor_value_info("extra", T.FLOAT, ["batch", "sequence", "width"]))
    path = tmp_path / "extra.onnx"
    onnx.save(model, path)
    res = cli("build", path, "--profile", "a10", "-o", tmp_path / "e")
    assert_one_line_error(res, 2, "extra", "width")
    assert not (tmp_path / "e").exists()


@pytest.mark.skipif(HAS_TRT, reason="full TensorRT is installed; h100 may be buildable here")
def test_h100_needs_full_tensorrt(cli, models: dict, tmp_path: Path) -> None:
    res = cli("build", models["fp32"], "--profile", "h100", "-o", tmp_path / "e")
    assert_one_line_error(res, 2, "9.0", "full TensorRT", "pypi.nvidia.com")
    assert not (tmp_path / "e").exists()
    res = cli("build", models["fp32"], "--profile", "h100", "--backend", "tensorrt", "-o", tmp_path / "e")
    assert_one_line_error(res, 2, "tensorrt", "pypi.nvidia.com")


def test_parse_failure_is_one_line_and_leaves_nothing(cli, tmp_path: Path) -> None:
    """An op TensorRT has no importer for: bad input (ModelError, exit 2; issue 11) with the parser's first error."""
    h = onnx.helper
    graph = h.make_graph([h.make_node("Mystery", ["x"], ["y"], domain="example.unknown")], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, ["batch", 8])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["batch", 8])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("example.unknown", 1)])
    path = tmp_path / "mystery.onnx"
    onnx.save(model, path)
    res = cli("build", path, "--profile", "a10", "-o", tmp_path / "e", "--no-progress")
    assert_one_line_error(res, 2, "cannot parse", "Mystery")
    assert not (tmp_path / "e").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mystery.onnx"]


def test_fresh_inputs_run_the_kept_onnx(built: dict, rng: np.random.Generator) -> None:
    """The model.onnx kept beside the a10 plan (fp16, built) runs in onnxruntime and matches the fp32 source."""
    import onnxruntime as ort

    ids = rng.integers(1, LlamaConfig().vocab, size=(2, 9), dtype=np.int64)
    kept = built[("a10", "fp32")] / "model.onnx"
    out = ort.InferenceSession(str(kept)).run(None, {"input_ids": ids})[0]
    ref = ort.InferenceSession(make_llama(seed=7).SerializeToString()).run(None, {"input_ids": ids})[0]
    assert np.max(np.abs(out - ref)) / np.max(np.abs(ref)) < 5e-3


def test_lora_plugin_model_builds_with_progress(models: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A bf16 model with LoRAOpPluginDynamic nodes: plugin link + registration, aliased plugin I/O, manifest."""
    from trtforge.plugins.lora import inject as inject_mod
    from trtforge.plugins.lora.spec import PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION

    model = inject_mod.inject(onnx.load(models["bf16"]), ["q_proj", "v_proj"], max_rank=8, slots=4)
    path = tmp_path / "lora.onnx"
    onnx.save(model, path)
    manifest = build_engine(path, "a100", tmp_path / "e", progress=True).to_json()
    assert manifest == json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert manifest["plugins"] == [{"name": PLUGIN_NAME, "namespace": PLUGIN_NAMESPACE, "version": PLUGIN_VERSION,
                                    "implementation": "python"}]
    assert (tmp_path / "e" / "model.plan").stat().st_size > 100_000
    by_name = {i["name"]: i for i in manifest["inputs"]}
    assert [i.name for i in model.graph.input] == list(by_name)
    for vi in model.graph.input:
        entry = by_name[vi.name]
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
        assert entry["shape"] == dims
        if -1 not in dims:  # adapter pools and scales are static: one shape in every optimization profile
            assert all(p["min"] == p["max"] == dims for p in entry["profiles"])
    assert "Traceback" not in capsys.readouterr().err
