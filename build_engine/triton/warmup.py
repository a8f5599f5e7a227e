"""Triton ``model_warmup`` entries from the manifest, so the first real request does not pay for kernel loading.

One sample per optimization profile, named ``profile_<k>``, with every engine input at that profile's *opt* shape
(a dim whose opt is 0 at 1):
with Triton batching (``max_batch_size > 0``) ``batch_size`` is the opt batch (capped at ``max_batch_size``) and
``dims`` the rest of the opt shape, since Triton sends ``batch_size`` requests of batch 1 (``dims`` exclude the
batch dimension); without batching ``batch_size`` is 1 and ``dims`` the whole opt shape.

Data is ``input_data_file`` for every input (Triton's ``random_data`` fills raw random bytes: token ids far outside
the vocabulary, NaN floats): ``NAME/warmup/profile_<k>.<n>.bin``, the row-major bytes of one batch-1 tensor, drawn
from a seeded generator by the project's one random-input planner (``verify.inputs.plan_feeds``/``draw``): when the
engine folder holds the ``model.onnx`` it was built from, integer inputs that index an embedding are token ids below
its vocabulary size and LoRA slot ids lie in ``[-1, slots)``; otherwise integers are small non-negative numbers
(0..7), booleans a fair coin, floats uniform in [-1, 1].

``check_files`` (used by ``trtforge triton --check``) verifies that each named file exists inside ``NAME/warmup``
and holds exactly ``prod(dims) * itemsize`` bytes.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.manifest import ONNX_NAME, Manifest
from .config import TritonConfig, WarmupInput, WarmupSample

WARMUP_DIR = "warmup"
# Triton data type -> bytes per element (TYPE_STRING has none: TensorRT cannot bind it anyway).
ITEMSIZE = {"TYPE_BOOL": 1, "TYPE_UINT8": 1, "TYPE_UINT16": 2, "TYPE_UINT32": 4, "TYPE_UINT64": 8, "TYPE_INT8": 1,
            "TYPE_INT16": 2, "TYPE_INT32": 4, "TYPE_INT64": 8, "TYPE_FP16": 2, "TYPE_FP32": 4, "TYPE_FP64": 8,
            "TYPE_BF16": 2}


def _ranges(manifest: Manifest, engine_dir: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """FeedSpec per input: from the engine's model.onnx when present (vocabulary-aware), else the defaults."""
    from ..verify.inputs import FeedSpec, plan_feeds

    onnx_path = engine_dir / ONNX_NAME
    if onnx_path.is_file():
        import onnx

        model = onnx.load(str(onnx_path), load_external_data=False)  # shapes and graph only, not the weights
        graph_names = {vi.name for vi in model.graph.input}
        known = {k: v for k, v in shapes.items() if k in graph_names}
        specs = {s.name: s for s in plan_feeds(model, shapes=known)}
    else:
        specs = {}
    out: dict[str, Any] = {}
    for t in manifest.inputs:
        spec = specs.get(t.name)
        if spec is not None and spec.dtype != t.dtype:  # the engine binds another type (TensorRT has no float64)
            spec = FeedSpec(t.name, t.dtype, spec.shape, spec.low, spec.high)
        if spec is None or spec.shape != shapes[t.name]:
            integer = t.dtype.startswith(("int", "uint"))
            low, high = (0, 1) if t.dtype == "bool" else (0, 7) if integer else (-1.0, 1.0)
            spec = FeedSpec(t.name, t.dtype, shapes[t.name], low, high)
        out[t.name] = spec
    return out


def _file_name(profile: int, index: int) -> str:
    return f"profile_{profile}.{index}.bin"  # input names may hold '/' or ':'; the file is found by the config


def plan_warmup(cfg: TritonConfig, manifest: Manifest, engine_dir: str | Path,
                seed: int = 0) -> tuple[TritonConfig, dict[str, bytes]]:
    """``cfg`` with one warm-up sample per optimization profile, and the files (name -> bytes) they read."""
    from ..verify.inputs import draw
    from .config import DTYPE_TO_TRITON

    batching = cfg.max_batch_size > 0
    rng = np.random.default_rng(seed)
    samples: list[WarmupSample] = []
    files: dict[str, bytes] = {}
    for k in range(manifest.optimization_profiles):
        # A dim whose opt is 0 (build --dim past=0:0:N) is warmed at 1: its profile admits it, and the sample's
        # dims must be concrete sizes >= 1 (the generated config was refused as invalid, exit 1).
        opt = {t.name: tuple(max(o, 1) if o == 0 and hi >= 1 else o for o, hi in zip(t.profiles[k].opt,
                                                                                    t.profiles[k].max, strict=True))
               if t.profiles else tuple(t.shape) for t in manifest.inputs}
        batch = min(max(1, opt[manifest.inputs[0].name][0]), cfg.max_batch_size) if batching else 1
        one = {name: ((1, *shape[1:]) if batching else shape) for name, shape in opt.items()}
        specs = _ranges(manifest, Path(engine_dir), one)
        inputs = []
        for i, t in enumerate(sorted(manifest.inputs, key=lambda t: t.name)):
            data = np.ascontiguousarray(draw(specs[t.name], rng))
            name = _file_name(k, i)
            files[name] = data.tobytes()
            dims = (one[t.name][1:] if batching else one[t.name]) or (1,)  # batch-only / scalar: dims [1], reshaped
            inputs.append(WarmupInput(t.name, DTYPE_TO_TRITON[t.dtype], tuple(dims), name))
        samples.append(WarmupSample(f"profile_{k}", batch, tuple(inputs)))
    return replace(cfg, warmup=tuple(samples)), files


def write_files(model_dir: Path, files: dict[str, bytes]) -> None:
    """Write the warm-up files into ``model_dir/warmup`` (``model_dir`` is the repository writer's temporary
    folder, renamed into place only when everything is written)."""
    if not files:
        return
    folder = model_dir / WARMUP_DIR
    folder.mkdir()
    for name, blob in files.items():
        (folder / name).write_bytes(blob)


def check_files(proto: Any, model_dir: Path) -> list[str]:
    """Problems with the files ``proto``'s ``model_warmup`` names (missing, escaping ``warmup/``, wrong size)."""
    from tritonclient.grpc import model_config_pb2 as pb  # lazy

    problems = []
    root = (model_dir / WARMUP_DIR).resolve()
    for w in proto.model_warmup:
        for name, t in w.inputs.items():
            if t.WhichOneof("input_data_type") != "input_data_file":
                continue
            path = (root / t.input_data_file).resolve()
            where = f"{model_dir}: model_warmup {w.name!r} input {name!r}"
            if root not in path.parents:
                problems.append(f"{where}: input_data_file {t.input_data_file!r} is outside {WARMUP_DIR}/")
                continue
            if not path.is_file():
                problems.append(f"{where}: {model_dir / WARMUP_DIR / t.input_data_file} is missing; rewrite the "
                                "entry with 'trtforge triton' (or --no-warmup)")
                continue
            size = ITEMSIZE.get(pb.DataType.Name(t.data_type))
            want = math.prod(t.dims) * size if size is not None else None
            have = path.stat().st_size
            if want is not None and have != want:
                problems.append(f"{where}: {path.name} holds {have} bytes, dims {list(t.dims)} of "
                                f"{pb.DataType.Name(t.data_type)} need {want}")
    return problems
