"""Triton model configuration for a trtforge engine: manifest -> ``TritonConfig`` (pure data) -> ``config.pbtxt``.

Everything is derived from the engine folder's ``manifest.json`` (``engine/manifest.py``), never from the plan, because
reading a plan needs a GPU.

Batch semantics (Triton's ``max_batch_size``): when ``max_batch_size > 0`` Triton prepends a batch dimension to every
input and output, so ``dims`` exclude it, and Triton sends any batch size from 1 to ``max_batch_size`` to the engine.
That is only safe when the engine's first dimension is a dynamic batch dimension everywhere: every input and output
has ``-1`` first, with the same range in every input of each optimization profile, every optimization profile
admits batch 1 (``min[0] == 1``), and no output's first dimension is another axis (``non_batch_outputs``: by the
engine folder's ``model.onnx``, e.g. a sequence-first ``[seq, batch, H]`` output, whose rows Triton would split
between the batched requests; ``--check`` reads only the manifest, which cannot tell). Then ``max_batch_size`` is the
largest batch every profile admits (or ``--max-batch``, which must not exceed it). Otherwise (e.g. a LoRA engine whose
adapter-pool inputs have a static first dimension) ``max_batch_size`` is 0 and ``dims`` are the full shapes.

Triton refuses a tensor without ``dims`` ("must specify 'dims'"): one that is only the batch dimension (``[batch]``,
e.g. a per-sequence score) or a scalar gets ``dims: [1]`` and ``reshape: { shape: [] }``, Triton's own spelling of
"no dimension beyond the batch" (the engine's tensor is what ``reshape`` says).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import InputError
from ..engine.manifest import MANIFEST_NAME, Manifest, ManifestTensor

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
    """One ``input``/``output`` entry: ``data_type`` is a Triton enum name, ``dims`` use -1 for dynamic; ``reshape``
    (when not None) the engine's shape without the batch dimension when it differs from ``dims`` (``()``: none)."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class WarmupInput:
    """One input of a ``model_warmup`` sample: ``dims`` exclude the batch dimension when batching; the data is
    ``file`` (under ``NAME/warmup/``, raw row-major bytes of one batch-1 tensor) or, when empty, ``kind``."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    file: str = ""
    kind: str = "input_data_file"  # input_data_file | random_data | zero_data


@dataclass(frozen=True)
class WarmupSample:
    """One ``model_warmup`` entry: Triton sends ``batch_size`` requests of batch 1 with these inputs at load."""

    name: str
    batch_size: int
    inputs: tuple[WarmupInput, ...]


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
    warmup: tuple[WarmupSample, ...] = ()


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


def load_for_triton(engine_dir: str | Path) -> Manifest:
    """``Manifest.load`` plus the Triton rules: every tensor's dtype has a Triton data type, and none is a scalar."""
    manifest = Manifest.load(engine_dir)
    check_triton_types(manifest, str(Path(engine_dir) / MANIFEST_NAME))
    return manifest


def check_triton_types(manifest: Manifest, where: str = MANIFEST_NAME) -> None:
    for kind, tensors in (("inputs", manifest.inputs), ("outputs", manifest.outputs)):
        for i, t in enumerate(tensors):
            if t.dtype not in DTYPE_TO_TRITON:
                raise InputError(f"{where}: {kind}[{i}] ({t.name}): dtype {t.dtype!r} has no Triton type; "
                                 f"expected one of {', '.join(DTYPE_TO_TRITON)}")
            if not t.shape:  # tritonserver: "scalar tensors are not supported" (and an engine with one cannot batch)
                raise InputError(f"{where}: {kind}[{i}] ({t.name}) is a scalar, and Triton serves no scalar tensors; "
                                 "give it shape [1] in the model (Unsqueeze / Reshape) and rebuild the engine")
            if 0 in t.shape:  # tritonserver: "dimension must be integer >= 1, or -1"; the config was refused, exit 1
                raise InputError(f"{where}: {kind}[{i}] ({t.name}) has shape {list(t.shape)}, an empty tensor, and "
                                 "Triton serves only dims >= 1 (or -1); remove that tensor from the model's "
                                 f"{kind} (or give it a size >= 1) and rebuild the engine")


def serving_notes(manifest: Manifest) -> list[str]:
    """Caveats Triton's config cannot express: which runtime must deserialize the plan."""
    name, version = manifest.backend.name, manifest.backend.version
    if name == "tensorrt_rtx":
        return [f"the plan was built by TensorRT-RTX {version}; Triton's stock tensorrt_plan backend links full "
                "TensorRT and cannot deserialize it: serve it with a Triton TensorRT backend built against "
                f"TensorRT-RTX {version}, or rebuild with 'trtforge build --backend tensorrt' for stock Triton"]
    return [f"the plan was built by TensorRT {version}; Triton's TensorRT backend must use that same version"]


def engine_max_batch(manifest: Manifest) -> int:
    """The largest batch every optimization profile admits, or 0 if the first dim is not a dynamic batch dim (the
    build says which dims are batch in the manifest's ``axes``: a sequence-first input is not batched): also when
    the inputs' first dims have different ranges in some profile (a ``build --dim`` dimension such as a count of
    adapters, not the batch: Triton would make every request send as many rows of it as of the batch)."""
    if any(not t.shape or t.shape[0] != -1 for t in manifest.inputs + manifest.outputs):
        return 0
    if any(t.axes and t.axes[0] != "batch" for t in manifest.inputs):  # e.g. [seq, batch, H] or packed [tokens, H]
        return 0
    firsts = {tuple((p.min[0], p.opt[0], p.max[0]) for p in t.profiles) for t in manifest.inputs}
    if len(firsts) > 1:
        return 0
    best: int | None = None
    for t in manifest.inputs:
        if not t.profiles:
            return 0
        for p in t.profiles:
            if p.min[0] != 1 or p.max[0] < 1:
                return 0  # Triton sends batch 1..max_batch_size: every profile must admit batch 1
            best = p.max[0] if best is None else min(best, p.max[0])
    return best or 0


def non_batch_outputs(manifest: Manifest, engine_dir: str | Path) -> tuple[str, ...]:
    """Outputs whose first dimension is, by the engine folder's ``model.onnx``, not the batch although it is dynamic:
    named as an input's sequence (or ``--dim``) dimension, or with a sequence name (``shapes.SEQUENCE_NAMES``), and
    not as a batch one (``[seq, batch, H]``, as a ``Transpose`` or an ONNX ``LSTM`` gives). Triton splits every
    output's first dimension between the requests it batched, so such an engine is served with ``max_batch_size``
    0. An output whose first dimension has another name, or none, counts as batch (the manifest alone cannot tell);
    without a readable ``model.onnx``, none is known."""
    import onnx

    from ..engine.manifest import ONNX_NAME
    from ..engine.shapes import SEQUENCE_NAMES

    path = Path(engine_dir) / ONNX_NAME
    from google.protobuf.message import DecodeError

    try:
        graph = onnx.load(str(path), load_external_data=False).graph if path.is_file() else None
    except (OSError, ValueError, DecodeError):  # not the build's model.onnx: judged by the manifest alone
        graph = None
    if graph is None:
        return ()
    axes = {t.name: t.axes for t in manifest.inputs}
    named = [(d.dim_param, axis) for vi in graph.input
             for d, axis in zip(vi.type.tensor_type.shape.dim, axes.get(vi.name, ()), strict=False) if d.dim_param]
    batch = {p for p, axis in named if axis == "batch"}
    other = {p for p, axis in named if axis != "batch"} - batch
    dynamic = {t.name for t in manifest.outputs if t.shape and t.shape[0] == -1}
    out = []
    for vi in graph.output:
        dims = vi.type.tensor_type.shape.dim
        first = dims[0].dim_param if vi.name in dynamic and len(dims) else ""
        if first and first not in batch and (first in other or first.lower() in SEQUENCE_NAMES):
            out.append(vi.name)
    return tuple(out)


def _preferred(manifest: Manifest, max_batch: int) -> tuple[int, ...]:
    """The profiles' opt batches and ``max_batch``, each within 1..max_batch (Triton's rule)."""
    sizes = {max_batch}
    for t in manifest.inputs:
        for p in t.profiles:
            if p.opt and 1 <= p.opt[0] <= max_batch:
                sizes.add(p.opt[0])
    return tuple(sorted(sizes))


#: instance_group count is int32 in Triton's ModelConfig; far fewer instances fit on any GPU. Stated limit.
MAX_INSTANCES = 1024
#: Triton parses version folder names as int64; a larger number is refused by the server at load time.
MAX_VERSION = 2**63 - 1


def plan_config(manifest: Manifest, name: str, *, max_batch: int | None = None,
                instances: int = 1, queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
                unbatched: tuple[str, ...] = ()) -> TritonConfig:
    """Pure planning: the Triton config for an engine manifest. Raises InputError for impossible requests.
    ``unbatched``: outputs whose first dimension is not the batch (``non_batch_outputs``): no Triton batching."""
    check_model_name(name)
    check_triton_types(manifest)
    bad = manifest.python_plugins
    if bad:
        raise InputError(
            f"the engine uses Python plugin(s) {', '.join(bad)}, which Triton's TensorRT backend cannot load; "
            "rebuild with full TensorRT's AOT plugin ('trtforge build --backend tensorrt'), or decompose the LoRA "
            "nodes first ('trtforge lora decompose') and rebuild, or serve it through Triton's Python backend")
    if not 1 <= instances <= MAX_INSTANCES:
        raise InputError(f"--instances {instances}: give a whole number from 1 to {MAX_INSTANCES} (GPU instances of "
                         "one model on one server)")
    inputs_max = engine_max_batch(manifest)
    engine_max = 0 if unbatched else inputs_max
    if max_batch is None:
        mbs = engine_max
    elif max_batch < 0:
        raise InputError(f"--max-batch {max_batch}: must be >= 0")
    elif max_batch > engine_max and unbatched and inputs_max:  # the outputs are the only reason
        raise InputError(f"--max-batch {max_batch}: the first dimension of output(s) {', '.join(unbatched)} is not "
                         "the batch (model.onnx names it as another axis), and Triton would split it between the "
                         "requests it batched; pass --max-batch 0, or make the outputs batch-first in the model and "
                         "rebuild the engine")
    elif max_batch > engine_max:
        why = (f"the engine's profiles admit at most batch {engine_max}" if engine_max else
               "the engine's first dimension is not a dynamic batch dimension shared by every input, admitting "
               "batch 1 in every profile")
        raise InputError(f"--max-batch {max_batch}: {why}; pass --max-batch <= {engine_max} or rebuild the engine "
                         "with a larger batch range")
    else:
        mbs = max_batch
    skip = 1 if mbs > 0 else 0

    def tensors(items: tuple[ManifestTensor, ...]) -> tuple[TensorConfig, ...]:
        # No dims left (batch-only or scalar): dims [1] reshaped to [], as Triton requires.
        return tuple(TensorConfig(t.name, DTYPE_TO_TRITON[t.dtype], t.shape[skip:] or (1,),
                                  None if t.shape[skip:] else ()) for t in items)

    n_prof = manifest.optimization_profiles
    return TritonConfig(
        name=name, max_batch_size=mbs, inputs=tensors(manifest.inputs), outputs=tensors(manifest.outputs),
        preferred_batch_sizes=_preferred(manifest, mbs) if mbs else (),
        max_queue_delay_us=queue_delay_us if mbs else 0, dynamic_batching=mbs > 0,
        instance_count=instances, profiles=tuple(str(i) for i in range(n_prof)))


def to_proto(cfg: TritonConfig) -> Any:
    """``cfg`` as tritonclient's ``ModelConfig`` protobuf."""
    from tritonclient.grpc import model_config_pb2 as pb  # lazy

    proto = pb.ModelConfig(name=cfg.name, platform=cfg.platform, max_batch_size=cfg.max_batch_size)
    for items, field in ((cfg.inputs, proto.input), (cfg.outputs, proto.output)):
        for t in items:
            entry = field.add(name=t.name, data_type=pb.DataType.Value(t.data_type), dims=list(t.dims))
            if t.reshape is not None:
                entry.reshape.SetInParent()  # present even when empty (a scalar)
                entry.reshape.shape.extend(t.reshape)
    if cfg.dynamic_batching:
        proto.dynamic_batching.SetInParent()  # present even when every field is at its default
        proto.dynamic_batching.preferred_batch_size.extend(cfg.preferred_batch_sizes)
        proto.dynamic_batching.max_queue_delay_microseconds = cfg.max_queue_delay_us
    proto.instance_group.add(count=cfg.instance_count, kind=pb.ModelInstanceGroup.KIND_GPU,
                             profile=list(cfg.profiles))
    for sample in cfg.warmup:
        w = proto.model_warmup.add(name=sample.name, batch_size=sample.batch_size)
        for wi in sample.inputs:
            inp = w.inputs[wi.name]
            inp.data_type = pb.DataType.Value(wi.data_type)
            inp.dims.extend(wi.dims)
            if wi.kind == "input_data_file":
                inp.input_data_file = wi.file
            else:
                setattr(inp, wi.kind, True)
    return proto


def render(cfg: TritonConfig, header: str = "") -> str:
    """``config.pbtxt`` text for ``cfg``: protobuf's own text format of ``to_proto(cfg)``, after a ``#`` comment
    header. (proto3 prints no field at its default value, e.g. ``max_batch_size: 0``; parsing gives it back.)"""
    from google.protobuf import text_format  # lazy: protobuf ships with tritonclient

    lines = [f"# {ln}" for ln in header.splitlines()]
    return "".join(ln + "\n" for ln in lines) + text_format.MessageToString(to_proto(cfg), as_utf8=True)


def config_from_proto(proto: Any) -> TritonConfig:
    """Back from a parsed ``ModelConfig`` to ``TritonConfig`` (for round trips). Fields trtforge does not write are
    ignored; a config with several instance groups keeps the first one's count and profiles."""
    from tritonclient.grpc import model_config_pb2 as pb  # lazy

    def tensors(items: Any) -> tuple[TensorConfig, ...]:
        return tuple(TensorConfig(t.name, pb.DataType.Name(t.data_type), tuple(t.dims),
                                  tuple(t.reshape.shape) if t.HasField("reshape") else None) for t in items)

    group = proto.instance_group[0] if proto.instance_group else None
    has_db = proto.HasField("dynamic_batching")
    warmup = tuple(WarmupSample(w.name, w.batch_size, tuple(
        WarmupInput(name, pb.DataType.Name(t.data_type), tuple(t.dims), t.input_data_file,
                    t.WhichOneof("input_data_type") or "zero_data") for name, t in sorted(w.inputs.items())))
        for w in proto.model_warmup)
    return TritonConfig(
        name=proto.name, max_batch_size=proto.max_batch_size, inputs=tensors(proto.input),
        outputs=tensors(proto.output),
        preferred_batch_sizes=tuple(proto.dynamic_batching.preferred_batch_size) if has_db else (),
        max_queue_delay_us=proto.dynamic_batching.max_queue_delay_microseconds if has_db else 0,
        dynamic_batching=has_db, instance_count=group.count if group else 1,
        profiles=tuple(group.profile) if group else (), platform=proto.platform, warmup=warmup)
