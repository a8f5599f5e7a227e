"""Triton model configuration for a trtforge engine: manifest -> ``TritonConfig`` (pure data) -> ``config.pbtxt``.

Everything is derived from the engine folder's ``manifest.json`` (DESIGN section 6), never from the plan, because
reading a plan needs a GPU.

Batch semantics (Triton's ``max_batch_size``): when ``max_batch_size > 0`` Triton prepends a batch dimension to every
input and output, so ``dims`` exclude it, and Triton sends any batch size from 1 to ``max_batch_size`` to the engine.
That is only safe when the engine's first dimension is a dynamic batch dimension everywhere: every input and output
has ``-1`` first, and every optimization profile admits batch 1 (``min[0] == 1``). Then ``max_batch_size`` is the
largest batch every profile admits (or ``--max-batch``, which must not exceed it). Otherwise (e.g. a LoRA engine whose
adapter-pool inputs have a static first dimension) ``max_batch_size`` is 0 and ``dims`` are the full shapes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import InputError

# numpy dtype names used in manifests -> Triton DataType enum names.
DTYPE_TO_TRITON: dict[str, str] = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16",
}

# Triton takes a model's name from its folder: keep to a portable, non-hidden, non-escaping set.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")
DEFAULT_QUEUE_DELAY_US = 100


@dataclass(frozen=True)
class TensorConfig:
    """One ``input``/``output`` entry: ``data_type`` is a Triton enum name, ``dims`` use -1 for dynamic."""

    name: str
    data_type: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class TritonConfig:
    """The subset of Triton's ModelConfig that trtforge writes (and reads back for round trips)."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    dynamic_batching: bool = False
    instance_count: int = 1
    profiles: tuple[str, ...] = ()
    platform: str = "tensorrt_plan"


def check_model_name(name: str) -> str:
    """Refuse names Triton would refuse or that escape the repository (``..``, ``/``, absolute, hidden, empty)."""
    if not name:
        raise InputError("--name is empty; give the model a name made of letters, digits, '_', '.', '-'")
    if name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise InputError(f"--name {name!r} would escape the repository or be hidden; use a plain folder name "
                         "made of letters, digits, '_', '.', '-' (not starting with '.')")
    if not _NAME_RE.match(name):
        raise InputError(f"--name {name!r} is not a valid Triton model name; use 1-255 characters from "
                         "[A-Za-z0-9_.-], not starting with '.' or '-'")
    return name


def load_manifest(engine_dir: str | Path) -> dict[str, Any]:
    """Read and structurally validate ``ENGINE_DIR/manifest.json`` (the keys the Triton writer needs)."""
    path = Path(engine_dir) / "manifest.json"
    if not Path(engine_dir).is_dir():
        raise InputError(f"{engine_dir}: not an engine folder; pass the folder 'trtforge build -o' wrote")
    if not path.is_file():
        raise InputError(f"{path}: missing; pass an engine folder written by 'trtforge build'")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); rebuild the engine with 'trtforge build'") from exc
    validate_manifest(manifest, str(path))
    return manifest


def _shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1
                                              for d in value):
        raise InputError(f"{where}: expected a list of integers >= -1, got {value!r}; rebuild the engine")
    return value


def validate_manifest(manifest: Any, where: str = "manifest.json") -> None:
    """Check the manifest keys (schema in COMMON interface 6) that the Triton writer and validator rely on."""
    if not isinstance(manifest, dict):
        raise InputError(f"{where}: expected a JSON object; rebuild the engine with 'trtforge build'")
    if manifest.get("format") != 1:
        raise InputError(f"{where}: key 'format' is {manifest.get('format')!r}, expected 1; rebuild the engine "
                         "with this trtforge version")
    if not isinstance(manifest.get("plan"), str) or not manifest["plan"]:
        raise InputError(f"{where}: key 'plan' missing; rebuild the engine with 'trtforge build'")
    n_prof = manifest.get("optimization_profiles", 1)
    if not isinstance(n_prof, int) or n_prof < 1:
        raise InputError(f"{where}: key 'optimization_profiles' must be an integer >= 1, got {n_prof!r}")
    for kind in ("inputs", "outputs"):
        tensors = manifest.get(kind)
        if not isinstance(tensors, list) or not tensors:
            raise InputError(f"{where}: key '{kind}' missing or empty; rebuild the engine with 'trtforge build'")
        for i, t in enumerate(tensors):
            key = f"{where}: {kind}[{i}]"
            if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
                raise InputError(f"{key}: needs a non-empty 'name'")
            if t.get("dtype") not in DTYPE_TO_TRITON:
                raise InputError(f"{key} ({t['name']}): dtype {t.get('dtype')!r} has no Triton type; "
                                 f"expected one of {', '.join(DTYPE_TO_TRITON)}")
            shape = _shape(t.get("shape"), f"{key} ({t['name']}).shape")
            if kind == "inputs":
                for j, prof in enumerate(input_profiles(t)):
                    for k in ("min", "opt", "max"):
                        dims = _shape(prof.get(k), f"{key} ({t['name']}).profiles[{j}].{k}")
                        if len(dims) != len(shape):
                            raise InputError(f"{key} ({t['name']}).profiles[{j}].{k} has rank {len(dims)}, shape "
                                             f"has rank {len(shape)}; rebuild the engine")
    names = [t["name"] for t in manifest["inputs"] + manifest["outputs"]]
    if len(set(names)) != len(names):
        raise InputError(f"{where}: tensor names repeat ({names}); rebuild the engine")
    plugins = manifest.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, dict) for p in plugins):
        raise InputError(f"{where}: key 'plugins' must be a list of objects")


def input_profiles(tensor: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-optimization-profile ``{min, opt, max}`` of an input (``profiles``, or the top-level range as one)."""
    profs = tensor.get("profiles")
    if isinstance(profs, list) and profs:
        return [p if isinstance(p, dict) else {} for p in profs]
    if "min" in tensor:
        return [{"min": tensor.get("min"), "opt": tensor.get("opt"), "max": tensor.get("max")}]
    return []


def python_plugins(manifest: dict[str, Any]) -> list[str]:
    """Plugins the engine needs whose implementation is Python (Triton's TensorRT backend cannot load them)."""
    return [f"{p.get('namespace', '')}::{p.get('name', '?')}" for p in manifest.get("plugins", [])
            if p.get("implementation") == "python"]


def serving_notes(manifest: dict[str, Any]) -> list[str]:
    """Caveats Triton's config cannot express: which runtime must deserialize the plan."""
    backend = manifest.get("backend")
    if not isinstance(backend, dict):
        backend = {}
    name, version = backend.get("name", "?"), backend.get("version", "?")
    if name == "tensorrt_rtx":
        return [f"the plan was built by TensorRT-RTX {version}; Triton's stock tensorrt_plan backend links full "
                "TensorRT and cannot deserialize it: serve it with a Triton TensorRT backend built against "
                f"TensorRT-RTX {version}, or rebuild with 'trtforge build --backend tensorrt' for stock Triton"]
    return [f"the plan was built by TensorRT {version}; Triton's TensorRT backend must use that same version"]


def engine_max_batch(manifest: dict[str, Any]) -> int:
    """The largest batch every optimization profile admits, or 0 if the first dim is not a dynamic batch dim."""
    tensors = manifest["inputs"] + manifest["outputs"]
    if any(not t["shape"] or t["shape"][0] != -1 for t in tensors):
        return 0
    best: int | None = None
    for t in manifest["inputs"]:
        profs = input_profiles(t)
        if not profs:
            return 0
        for p in profs:
            if p["min"][0] != 1 or p["max"][0] < 1:
                return 0  # Triton sends batch 1..max_batch_size: every profile must admit batch 1
            best = p["max"][0] if best is None else min(best, p["max"][0])
    return best or 0


def _preferred(manifest: dict[str, Any], max_batch: int) -> tuple[int, ...]:
    """The profiles' opt batches and ``max_batch``, each within 1..max_batch (Triton's rule)."""
    sizes = {max_batch}
    for t in manifest["inputs"]:
        for p in input_profiles(t):
            opt = p.get("opt") or []
            if opt and 1 <= opt[0] <= max_batch:
                sizes.add(opt[0])
    return tuple(sorted(sizes))


def plan_config(manifest: dict[str, Any], name: str, *, max_batch: int | None = None,
                instances: int = 1, queue_delay_us: int = DEFAULT_QUEUE_DELAY_US) -> TritonConfig:
    """Pure planning: the Triton config for an engine manifest. Raises InputError for impossible requests."""
    check_model_name(name)
    bad = python_plugins(manifest)
    if bad:
        raise InputError(
            f"the engine uses Python plugin(s) {', '.join(bad)}, which Triton's TensorRT backend cannot load; "
            "rebuild with full TensorRT's AOT plugin ('trtforge build --backend tensorrt'), or decompose the LoRA "
            "nodes first ('trtforge lora decompose') and rebuild, or serve it through Triton's Python backend")
    if instances < 1:
        raise InputError(f"--instances {instances}: must be at least 1")
    engine_max = engine_max_batch(manifest)
    if max_batch is None:
        mbs = engine_max
    elif max_batch < 0:
        raise InputError(f"--max-batch {max_batch}: must be >= 0")
    elif max_batch > engine_max:
        why = (f"the engine's profiles admit at most batch {engine_max}" if engine_max else
               "the engine's first dimension is not a dynamic batch dimension admitting batch 1 in every profile")
        raise InputError(f"--max-batch {max_batch}: {why}; pass --max-batch <= {engine_max} or rebuild the engine "
                         "with a larger batch range")
    else:
        mbs = max_batch
    skip = 1 if mbs > 0 else 0

    def tensors(kind: str) -> tuple[TensorConfig, ...]:
        return tuple(TensorConfig(t["name"], DTYPE_TO_TRITON[t["dtype"]], tuple(t["shape"][skip:]))
                     for t in manifest[kind])

    n_prof = int(manifest.get("optimization_profiles", 1))
    return TritonConfig(
        name=name, max_batch_size=mbs, inputs=tensors("inputs"), outputs=tensors("outputs"),
        preferred_batch_sizes=_preferred(manifest, mbs) if mbs else (),
        max_queue_delay_us=queue_delay_us if mbs else 0, dynamic_batching=mbs > 0,
        instance_count=instances, profiles=tuple(str(i) for i in range(n_prof)))


def _q(text: str) -> str:
    from google.protobuf import text_encoding  # lazy: protobuf ships with tritonclient

    return '"' + text_encoding.CEscape(text, as_utf8=True) + '"'


def _ints(values: tuple[int, ...]) -> str:
    return "[ " + ", ".join(str(v) for v in values) + " ]"


def _tensor_block(kind: str, tensors: tuple[TensorConfig, ...]) -> list[str]:
    lines = [f"{kind} ["]
    for i, t in enumerate(tensors):
        lines += ["  {", f"    name: {_q(t.name)}", f"    data_type: {t.data_type}", f"    dims: {_ints(t.dims)}",
                  "  }" + ("," if i < len(tensors) - 1 else "")]
    return lines + ["]"]


def render(cfg: TritonConfig, header: str = "") -> str:
    """``config.pbtxt`` text for ``cfg`` (protobuf text format; ``#`` comments allowed)."""
    lines = [f"# {ln}" for ln in header.splitlines()]
    lines += [f"name: {_q(cfg.name)}", f"platform: {_q(cfg.platform)}", f"max_batch_size: {cfg.max_batch_size}"]
    lines += _tensor_block("input", cfg.inputs) + _tensor_block("output", cfg.outputs)
    if cfg.dynamic_batching:
        lines += ["dynamic_batching {"]
        if cfg.preferred_batch_sizes:
            lines += [f"  preferred_batch_size: {_ints(cfg.preferred_batch_sizes)}"]
        lines += [f"  max_queue_delay_microseconds: {cfg.max_queue_delay_us}", "}"]
    lines += ["instance_group [", "  {", f"    count: {cfg.instance_count}", "    kind: KIND_GPU"]
    if cfg.profiles:
        lines += ["    profile: [ " + ", ".join(_q(p) for p in cfg.profiles) + " ]"]
    lines += ["  }", "]"]
    return "\n".join(lines) + "\n"


def config_from_proto(proto: Any) -> TritonConfig:
    """Back from a parsed ``ModelConfig`` to ``TritonConfig`` (for round trips). Fields trtforge does not write are
    ignored; a config with several instance groups keeps the first one's count and profiles."""
    from tritonclient.grpc import model_config_pb2 as pb  # lazy

    def tensors(items: Any) -> tuple[TensorConfig, ...]:
        return tuple(TensorConfig(t.name, pb.DataType.Name(t.data_type), tuple(t.dims)) for t in items)

    group = proto.instance_group[0] if proto.instance_group else None
    has_db = proto.HasField("dynamic_batching")
    return TritonConfig(
        name=proto.name, max_batch_size=proto.max_batch_size, inputs=tensors(proto.input),
        outputs=tensors(proto.output),
        preferred_batch_sizes=tuple(proto.dynamic_batching.preferred_batch_size) if has_db else (),
        max_queue_delay_us=proto.dynamic_batching.max_queue_delay_microseconds if has_db else 0,
        dynamic_batching=has_db, instance_count=group.count if group else 1,
        profiles=tuple(group.profile) if group else (), platform=proto.platform)
