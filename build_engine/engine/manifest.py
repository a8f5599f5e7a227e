"""The engine manifest: ``OUTDIR/manifest.json`` as a frozen, validated ``Manifest`` (COMMON interface item 6).

Everything downstream (Triton config, diff, the demo) reads the manifest, never the plan, because reading a plan
needs a GPU; and it reads it through this class only (``Manifest.load``), so the file's keys are spelled here once.

- ``Manifest.make``: from the build's facts (the builder calls it and writes ``to_json`` beside ``model.plan``);
- ``Manifest.to_json`` / ``Manifest.from_json``: the on-disk JSON, the same keys and layout as before this class
  existed (``to_json(from_json(d)) == d`` for every manifest ``trtforge build`` writes);
- ``Manifest.validate``: the cross-field rules (unique tensor names, profile ranks, profile count).

``format`` is the version of the file layout. A file with a higher format than ``FORMAT`` was written by a newer
trtforge and is refused with that reason. New optional information goes into an optional field whose default is
``None`` (see ``_OPTIONAL``): ``to_json`` leaves it out while it is ``None``, so older files stay valid and unchanged,
and keys this version does not know are ignored on reading.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..core.errors import InputError
from ..core.jsonout import unique_keys, unreadable
from .shapes import InputPlan, ShapeRange

FORMAT = 1
PLAN_NAME = "model.plan"
MANIFEST_NAME = "manifest.json"
ONNX_NAME = "model.onnx"
_REBUILD = "rebuild the engine with 'trtforge build'"
#: Bounds of what a manifest may say, checked on reading so no consumer allocates from a hand-edited number: a dim
#: is int32 (TensorRT shapes, Triton's max_batch_size); trtforge builds a handful of optimization profiles.
MAX_DIM = 2**31 - 1
MAX_PROFILES = 1024


@dataclass(frozen=True)
class TensorInfo:
    """An engine input or output as the parsed network sees it (``-1`` marks a dynamic dim)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ManifestTensor:
    """An engine input or output; ``profiles`` (inputs only): its range in each optimization profile; ``axes``
    (inputs only, optional: older manifests have none): what each dim is, as ``shapes.InputPlan.axes`` ("batch",
    "sequence", "static", "tokens", "dim:NAME"), so that a reader (Triton's max_batch_size) can tell a batch dim from
    a sequence-first one."""

    name: str
    dtype: str  # numpy name: float32, float16, bfloat16, int64, ...
    shape: tuple[int, ...]  # -1 marks a dynamic dim
    profiles: tuple[ShapeRange, ...] = ()
    axes: tuple[str, ...] = ()

    @property
    def envelope(self) -> ShapeRange | None:
        """Overall min/max over all optimization profiles; opt is the first profile's opt."""
        if not self.profiles:
            return None
        rank = range(len(self.shape))
        return ShapeRange(min=tuple(min(p.min[i] for p in self.profiles) for i in rank), opt=self.profiles[0].opt,
                          max=tuple(max(p.max[i] for p in self.profiles) for i in rank))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        env = self.envelope
        if env is not None:
            out.update(env.to_json())
            out["profiles"] = [p.to_json() for p in self.profiles]
        if self.axes:
            out["axes"] = list(self.axes)
        return out


@dataclass(frozen=True)
class BackendInfo:
    name: str  # "tensorrt" or "tensorrt_rtx"
    version: str


@dataclass(frozen=True)
class PluginInfo:
    """A plugin the engine needs at runtime. ``implementation`` "python": an IPluginV3 written in Python (Triton's
    TensorRT backend cannot load it)."""

    name: str
    namespace: str
    version: str
    implementation: str

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}::{self.name}"


@dataclass(frozen=True)
class QuantizationInfo:
    """A quantized (explicit Q/DQ) model's facts, as ``trtforge quantize`` stored them in the model: the mode
    (int8, int4-wo, fp8), where the calibration samples came from, and the projections kept in float."""

    mode: str
    calibration: str
    excluded: tuple[str, ...] = ()
    calibrator: str | None = None
    quantized: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "calibration": self.calibration, "calibrator": self.calibrator,
                "quantized": self.quantized, "excluded": list(self.excluded)}

    @classmethod
    def from_json(cls, data: Any, where: str | Path) -> QuantizationInfo:
        ok = (isinstance(data, Mapping) and isinstance(data.get("mode"), str)
              and isinstance(data.get("calibration"), str) and isinstance(data.get("excluded", []), list))
        if not ok:
            raise InputError(f"{where}: quantization: expected an object with mode, calibration and excluded; "
                             f"{_REBUILD}")
        quantized = data.get("quantized")
        return cls(data["mode"], data["calibration"], tuple(str(e) for e in data.get("excluded", [])),
                   data.get("calibrator"), int(quantized) if isinstance(quantized, int) else None)


@dataclass(frozen=True)
class Manifest:
    format: int
    plan: str  # the plan's file name inside the engine folder
    backend: BackendInfo
    profile: str
    precision: str
    compute_capabilities: tuple[str, ...]
    inputs: tuple[ManifestTensor, ...]
    outputs: tuple[ManifestTensor, ...]
    optimization_profiles: int
    plugins: tuple[PluginInfo, ...]
    # sha256 of the source model file's bytes followed by each external data file it names (first-use order), so a
    # changed weight changes it; for a model without external data, the file's own sha256.
    onnx_sha256: str
    plan_sha256: str
    build_seconds: float
    # Optional fields go below, each with default None and an entry in _OPTIONAL.
    quantization: QuantizationInfo | None = None

    # --------------------------------------------------------------------------------------------------- making
    @classmethod
    def make(cls, *, backend_name: str, backend_version: str, profile: str, precision: str,
             compute_capabilities: Sequence[str], inputs: Sequence[TensorInfo], input_plans: Sequence[InputPlan],
             outputs: Sequence[TensorInfo], plugins: Sequence[PluginInfo], onnx_sha256: str, plan_sha256: str,
             build_seconds: float, quantization: QuantizationInfo | None = None) -> Manifest:
        """The manifest of a finished build (``inputs``/``outputs`` as the parsed network has them)."""
        plans = {p.spec.name: p for p in input_plans}
        n_profiles = len(input_plans[0].ranges) if input_plans else 0
        ins = []
        for t in inputs:
            plan = plans.get(t.name)
            ins.append(ManifestTensor(t.name, t.dtype, tuple(t.shape), tuple(plan.ranges) if plan else (),
                                      plan.axes if plan and len(plan.axes) == len(t.shape) else ()))
        return cls(format=FORMAT, plan=PLAN_NAME, backend=BackendInfo(backend_name, backend_version),
                   profile=profile, precision=precision, compute_capabilities=tuple(compute_capabilities),
                   inputs=tuple(ins), outputs=tuple(ManifestTensor(t.name, t.dtype, tuple(t.shape)) for t in outputs),
                   optimization_profiles=n_profiles, plugins=tuple(plugins), onnx_sha256=onnx_sha256,
                   plan_sha256=plan_sha256, build_seconds=round(build_seconds, 3), quantization=quantization)

    # ------------------------------------------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        """The ``manifest.json`` object (key order as written since format 1)."""
        out: dict[str, Any] = {
            "format": self.format, "plan": self.plan,
            "backend": {"name": self.backend.name, "version": self.backend.version},
            "profile": self.profile, "precision": self.precision,
            "compute_capabilities": list(self.compute_capabilities),
            "inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs],
            "optimization_profiles": self.optimization_profiles,
            "plugins": [{"name": p.name, "namespace": p.namespace, "version": p.version,
                         "implementation": p.implementation} for p in self.plugins],
            "onnx_sha256": self.onnx_sha256, "plan_sha256": self.plan_sha256, "build_seconds": self.build_seconds,
        }
        for key, (_, encode) in _OPTIONAL.items():
            value = getattr(self, key)
            if value is not None:
                out[key] = encode(value)
        return out

    def dumps(self) -> str:
        """``manifest.json``'s text."""
        return json.dumps(self.to_json(), indent=2) + "\n"

    @classmethod
    def from_json(cls, data: Any, where: str = MANIFEST_NAME) -> Manifest:
        """Read and validate a parsed ``manifest.json``; every error is one line naming ``where`` and the fix."""
        r = _Reader(where)
        if not isinstance(data, dict):
            raise r.fail("", f"expected a JSON object; {_REBUILD}")
        fmt = data.get("format")
        if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > FORMAT:
            raise r.fail("", f"format {fmt} was written by a newer trtforge (this one reads format {FORMAT}); "
                             f"upgrade trtforge, or {_REBUILD} of this version")
        if fmt != FORMAT:
            raise r.fail("", f"key 'format' is {fmt!r}, expected {FORMAT}; {_REBUILD} of this version")
        # Read in the order the Triton writer needs them, so a hand-made file gets the most useful error first.
        plan = r.text(data, "plan")
        inputs, outputs = r.tensors(data, "inputs"), r.tensors(data, "outputs")
        n_profiles = r.integer(data, "optimization_profiles", low=1, high=MAX_PROFILES)
        plugins = tuple(r.plugin(p, i) for i, p in enumerate(r.lst(data, "plugins")))
        backend = r.obj(data, "backend", "")
        man = cls(
            format=FORMAT, plan=plan,
            backend=BackendInfo(r.text(backend, "name", "backend."), r.text(backend, "version", "backend.")),
            profile=r.text(data, "profile"), precision=r.text(data, "precision"),
            compute_capabilities=tuple(r.text_list(data, "compute_capabilities")),
            inputs=inputs, outputs=outputs, optimization_profiles=n_profiles, plugins=plugins,
            onnx_sha256=r.text(data, "onnx_sha256"), plan_sha256=r.text(data, "plan_sha256"),
            build_seconds=r.number(data, "build_seconds"),
            **{key: decode(data[key], f"{where}: key '{key}'") for key, (decode, _) in _OPTIONAL.items()
               if data.get(key) is not None},
        )
        man.validate(where)
        return man

    # -------------------------------------------------------------------------------------------------- reading
    @classmethod
    def load(cls, engine_dir: str | Path) -> Manifest:
        """Read ``ENGINE_DIR/manifest.json``; raises InputError naming the file and the fix."""
        folder = Path(engine_dir)
        path = folder / MANIFEST_NAME
        if not folder.is_dir():
            raise InputError(f"{engine_dir}: not an engine folder; pass the folder 'trtforge build -o' wrote")
        if not path.is_file():
            raise InputError(f"{path}: missing; pass an engine folder written by 'trtforge build'")
        try:
            data = json.loads(path.read_text(encoding="utf-8-sig"),  # -sig: a leading BOM (Windows) skipped
                              object_pairs_hook=unique_keys)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: not valid JSON ({exc}); {_REBUILD}") from exc
        except (ValueError, RecursionError) as exc:  # an integer of over 4300 digits; nesting past Python's stack
            raise InputError(f"{path}: not a readable manifest ({unreadable(exc)}); {_REBUILD}") from exc
        return cls.from_json(data, str(path))

    def validate(self, where: str = MANIFEST_NAME) -> None:
        """Cross-field rules: unique tensor names; every input's profile count and ranks agree with the engine."""
        names = [t.name for t in self.inputs + self.outputs]
        if len(set(names)) != len(names):
            raise InputError(f"{where}: tensor names repeat ({names}); {_REBUILD}")
        for i, t in enumerate(self.inputs):
            for j, prof in enumerate(t.profiles):
                for k in ("min", "opt", "max"):
                    dims = getattr(prof, k)
                    if len(dims) != len(t.shape):
                        raise InputError(f"{where}: inputs[{i}] ({t.name}).profiles[{j}].{k} has rank {len(dims)}, "
                                         f"shape has rank {len(t.shape)}; {_REBUILD}")
            if t.profiles and len(t.profiles) != self.optimization_profiles:
                raise InputError(f"{where}: inputs[{i}] ({t.name}) has {len(t.profiles)} profiles but "
                                 f"'optimization_profiles' is {self.optimization_profiles}; {_REBUILD}")

    @property
    def python_plugins(self) -> list[str]:
        """``namespace::name`` of the plugins whose implementation is Python."""
        return [p.qualified_name for p in self.plugins if p.implementation == "python"]


# Optional manifest keys: name -> (decode(json value, where) -> field value, encode(field value) -> json value).
# A field listed here must be declared on Manifest with default None.
_OPTIONAL: Mapping[str, tuple[Callable[[Any, str], Any], Callable[[Any], Any]]] = {
    "quantization": (QuantizationInfo.from_json, QuantizationInfo.to_json),
}


class _Reader:
    """Typed reads of manifest keys; every failure names the file, the key and the fix."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, key: str, problem: str) -> InputError:
        return InputError(f"{self.where}: {key + ': ' if key else ''}{problem}")

    def get(self, data: Mapping[str, Any], key: str, prefix: str = "") -> Any:
        if key not in data:
            raise self.fail("", f"key '{prefix}{key}' missing; {_REBUILD}")
        return data[key]

    def text(self, data: Mapping[str, Any], key: str, prefix: str = "") -> str:
        value = self.get(data, key, prefix)
        if not isinstance(value, str) or not value:
            raise self.fail("", f"key '{prefix}{key}' must be a non-empty string, got {value!r}; {_REBUILD}")
        return value

    def integer(self, data: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int:
        value = self.get(data, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f">= {low} and <= {high}"
            raise self.fail("", f"key '{key}' must be an integer {bound}, got {value!r}; {_REBUILD}")
        return value

    def number(self, data: Mapping[str, Any], key: str) -> float:
        value = self.get(data, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise self.fail("", f"key '{key}' must be a number >= 0, got {value!r}; {_REBUILD}")
        return float(value)

    def obj(self, data: Mapping[str, Any], key: str, prefix: str) -> Mapping[str, Any]:
        value = self.get(data, key, prefix)
        if not isinstance(value, dict):
            raise self.fail("", f"key '{prefix}{key}' must be an object; {_REBUILD}")
        return value

    def lst(self, data: Mapping[str, Any], key: str) -> list[Any]:
        value = self.get(data, key)
        if not isinstance(value, list):
            raise self.fail("", f"key '{key}' must be a list; {_REBUILD}")
        return value

    def text_list(self, data: Mapping[str, Any], key: str) -> list[str]:
        value = self.lst(data, key)
        if not all(isinstance(v, str) and v for v in value):
            raise self.fail("", f"key '{key}' must be a list of strings, got {value!r}; {_REBUILD}")
        return value

    def shape(self, value: Any, key: str) -> tuple[int, ...]:
        if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and -1 <= d <= MAX_DIM
                                                  for d in value):
            raise self.fail(key, f"expected a list of integers >= -1 and <= {MAX_DIM}, got {value!r}; rebuild the "
                                 "engine")
        return tuple(value)

    def tensors(self, data: Mapping[str, Any], kind: str) -> tuple[ManifestTensor, ...]:
        items = data.get(kind)
        if not isinstance(items, list) or not items:
            raise self.fail("", f"key '{kind}' missing or empty; {_REBUILD}")
        return tuple(self.tensor(t, f"{kind}[{i}]", kind == "inputs") for i, t in enumerate(items))

    def tensor(self, t: Any, key: str, is_input: bool) -> ManifestTensor:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise self.fail(key, "needs a non-empty 'name'")
        key = f"{key} ({t['name']})"
        if not isinstance(t.get("dtype"), str) or not t["dtype"]:
            raise self.fail(key, f"dtype {t.get('dtype')!r} is not a type name; {_REBUILD}")
        shape = self.shape(t.get("shape"), f"{key}.shape")
        axes = t.get("axes", [])
        if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes) or len(axes) not in (0, len(shape)):
            raise self.fail(f"{key}.axes", f"expected one name per dim of shape {list(shape)}, got {axes!r}; "
                                           f"{_REBUILD}")
        return ManifestTensor(t["name"], t["dtype"], shape, self.profiles(t, key) if is_input else (),
                              tuple(axes) if is_input else ())

    def profiles(self, t: Mapping[str, Any], key: str) -> tuple[ShapeRange, ...]:
        """``profiles``; a file with only the top-level ``min/opt/max`` range reads as one profile."""
        profs = t.get("profiles")
        if not (isinstance(profs, list) and profs):
            profs = [{k: t.get(k) for k in ("min", "opt", "max")}] if "min" in t else []
        out = []
        for j, p in enumerate(profs):
            p = p if isinstance(p, dict) else {}
            out.append(ShapeRange(*(self.shape(p.get(k), f"{key}.profiles[{j}].{k}") for k in ("min", "opt", "max"))))
        return tuple(out)

    def plugin(self, p: Any, i: int) -> PluginInfo:
        if not isinstance(p, dict):
            raise self.fail("", f"key 'plugins' must be a list of objects; {_REBUILD}")
        return PluginInfo(*(self.text(p, f.name, f"plugins[{i}].") for f in fields(PluginInfo)))
