"""The typed engine manifest: make -> to_json -> from_json round trip, validation errors, and the on-disk format."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.build_engine.engine.manifest import (
    FORMAT,
    Manifest,
    ManifestTensor,
    PluginInfo,
    ShapeRange,
    TensorInfo,
)
from trtforge.build_engine.engine.shapes import InputPlan, InputSpec

# A manifest as 'trtforge build' wrote it before the Manifest class existed (format 1): the class must read it and
# write it back byte for byte.
FORMAT_1 = {
    "format": 1, "plan": "model.plan", "backend": {"name": "tensorrt_rtx", "version": "1.7.1.116"},
    "profile": "a100", "precision": "bf16", "compute_capabilities": ["8.0"],
    "inputs": [
        {"name": "input_ids", "dtype": "int64", "shape": [-1, -1], "min": [1, 1], "opt": [8, 1], "max": [16, 1024],
         "profiles": [{"min": [1, 1], "opt": [8, 1], "max": [16, 16]},
                      {"min": [1, 1], "opt": [4, 256], "max": [16, 1024]}]},
        {"name": "lora_slot_ids", "dtype": "int32", "shape": [-1], "min": [1], "opt": [8], "max": [16],
         "profiles": [{"min": [1], "opt": [8], "max": [16]}, {"min": [1], "opt": [4], "max": [16]}]},
    ],
    "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, -1, 1024]}],
    "optimization_profiles": 2,
    "plugins": [{"name": "LoRAOpPluginDynamic", "namespace": "trtforge", "version": "1", "implementation": "python"}],
    "onnx_sha256": "a" * 64, "plan_sha256": "b" * 64, "build_seconds": 1.234,
}


def test_format_1_round_trips_exactly(tmp_path: Path) -> None:
    man = Manifest.from_json(copy.deepcopy(FORMAT_1))
    assert man.to_json() == FORMAT_1 and list(man.to_json()) == list(FORMAT_1)
    assert man.inputs[0].profiles[1] == ShapeRange((1, 1), (4, 256), (16, 1024))
    assert man.python_plugins == ["trtforge::LoRAOpPluginDynamic"]
    (tmp_path / "manifest.json").write_text(man.dumps())
    assert Manifest.load(tmp_path) == man
    assert json.loads((tmp_path / "manifest.json").read_text()) == FORMAT_1


def test_make_matches_the_format() -> None:
    spec = InputSpec("input_ids", 7, ("batch", "sequence"))
    plan = InputPlan(spec, ("batch", "sequence"), (ShapeRange((1, 1), (8, 1), (16, 16)),
                                                   ShapeRange((1, 1), (4, 256), (16, 1024))))
    slot = InputPlan(InputSpec("lora_slot_ids", 6, ("batch",)), ("batch",),
                     (ShapeRange((1,), (8,), (16,)), ShapeRange((1,), (4,), (16,))))
    man = Manifest.make(backend_name="tensorrt_rtx", backend_version="1.7.1.116", profile="a100", precision="bf16",
                        compute_capabilities=["8.0"],
                        inputs=[TensorInfo("input_ids", "int64", (-1, -1)),
                                TensorInfo("lora_slot_ids", "int32", (-1,))],
                        input_plans=[plan, slot], outputs=[TensorInfo("logits", "float32", (-1, -1, 1024))],
                        plugins=[PluginInfo("LoRAOpPluginDynamic", "trtforge", "1", "python")],
                        onnx_sha256="a" * 64, plan_sha256="b" * 64, build_seconds=1.23449)
    want = copy.deepcopy(FORMAT_1)  # plus what each input dim is (format 1 readers ignore the key)
    want["inputs"][0]["axes"], want["inputs"][1]["axes"] = ["batch", "sequence"], ["batch"]
    assert man.to_json() == want  # envelope derived from the profiles, build_seconds rounded to ms
    assert Manifest.from_json(man.to_json()) == man


def test_envelope_only_input_reads_as_one_profile() -> None:
    data = copy.deepcopy(FORMAT_1)
    data["optimization_profiles"] = 1
    for t in data["inputs"]:
        del t["profiles"]
    man = Manifest.from_json(data)
    assert man.inputs[0].profiles == (ShapeRange((1, 1), (8, 1), (16, 1024)),)


def _mutated(path: str, value: object) -> dict:
    data = copy.deepcopy(FORMAT_1)
    *parents, last = path.split(".")
    target: object = data
    for p in parents:
        target = target[int(p)] if isinstance(target, list) else target[p]  # type: ignore[index]
    if value is KeyError:
        del target[last]  # type: ignore[union-attr]
    else:
        target[last] = value  # type: ignore[index]
    return data


@pytest.mark.parametrize("path,value,needles", [
    ("format", 2, ["format 2", "newer trtforge", "upgrade trtforge"]),
    ("format", 0, ["'format' is 0", "expected 1"]),
    ("format", KeyError, ["'format' is None"]),
    ("plan", "", ["'plan'", "non-empty"]),
    ("inputs", [], ["'inputs' missing or empty"]),
    ("backend", KeyError, ["'backend' missing"]),
    ("backend.version", 7, ["'backend.version'"]),
    ("plan_sha256", KeyError, ["'plan_sha256' missing"]),
    ("optimization_profiles", 0, ["'optimization_profiles'", ">= 1"]),
    ("optimization_profiles", 3, ["has 2 profiles", "'optimization_profiles' is 3"]),
    ("inputs.0.shape", [-1, "x"], ["inputs[0] (input_ids).shape", "integers >= -1"]),
    ("inputs.0.profiles.1.max", [16], ["profiles[1].max has rank 1"]),
    ("inputs.1.name", "logits", ["tensor names repeat"]),
    ("outputs.0.dtype", None, ["outputs[0] (logits)", "dtype None"]),
    ("plugins", [{"name": "P"}], ["'plugins[0].namespace' missing"]),
])
def test_invalid_manifests_name_the_file_and_the_fix(path: str, value: object, needles: list[str]) -> None:
    with pytest.raises(InputError) as err:
        Manifest.from_json(_mutated(path, value), "eng/manifest.json")
    msg = err.value.message
    assert msg.startswith("eng/manifest.json: ") and "\n" not in msg
    assert all(n in msg for n in needles), msg
    assert "rebuild the engine" in msg or "upgrade trtforge" in msg


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not an engine folder"):
        Manifest.load(tmp_path / "nope")
    with pytest.raises(InputError, match=r"manifest.json: missing"):
        Manifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        Manifest.load(tmp_path)


def test_manifest_is_frozen_and_unknown_keys_are_ignored() -> None:
    data = copy.deepcopy(FORMAT_1)
    data["written_by_a_newer_minor"] = {"x": 1}
    man = Manifest.from_json(data)
    assert man.to_json() == FORMAT_1
    with pytest.raises(AttributeError):
        man.plan = "other.plan"  # type: ignore[misc]
    assert isinstance(man.outputs[0], ManifestTensor) and man.outputs[0].envelope is None
    assert FORMAT == 1
