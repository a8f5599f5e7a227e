"""PEFT adapter folders -> slot-pool tensors named like the injected graph's inputs.

An adapter folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, ``use_rslora``,
``rank_pattern`` / ``alpha_pattern``: per-module ranks and alphas, matched as PEFT does, see ``peft_config``) and
``adapter_model.safetensors`` with ``base_model.model.<module path>.lora_A.weight`` [r, H] and ``...lora_B.weight``
[O, r]. Adapter ``i`` goes to slot ``i``. For each module path the pool holds ``lora_a.<path>`` [N, H, R] (A
transposed), ``lora_b.<path>`` [N, R, O] (B transposed), zero-padded to R, and ``lora_scales.<path>`` float32 [N]
with ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` for rsLoRA) of the module's own rank and alpha. Slots whose
adapter does not adapt a module hold zeros and scale 0, which adds exactly nothing.

``target_modules`` follows PEFT: a list matches a module whose path equals a name or ends with ``.name``; a string
is a regular expression the whole module path must match (``re.fullmatch``), ``"all-linear"`` every module. A
config without ``lora_alpha`` gets PEFT's ``LoraConfig`` default, 8.

Refused (InputError, exit 2, naming the folder and tensor): a missing or malformed config or weights file (an
``adapter_model.bin`` pickle is named with the one-line conversion to safetensors), a
weight whose dtype is not F16/BF16/F32/F64 or whose data does not match its header shape, two weights of one module
(two adapter names in one file), a NaN/inf weight or one beyond the pool dtype's range (fp16: 65504), a rank
above the max, A/B shapes that disagree with each other, the config or other adapters, tensors of modules that are
not targeted (not in ``target_modules``, ``--targets`` or the model's LoRA inputs), and every adapter feature
whose effect is more than ``scale * B @ A`` added to a projection: DoRA (``use_dora``), trained biases (``bias``
other than ``"none"``), ``modules_to_save``, and any tensor in the weights file that is not a ``lora_A`` /
``lora_B`` weight (embedding LoRA, DoRA magnitudes, biases): dropping one silently would change the adapted model's
outputs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.build_engine.core.errors import InputError
from trtforge.build_engine.core.jsonout import unique_keys

from . import spec
from .peft_config import Targets, read_config

_KEY = re.compile(r"^base_model\.model\.(?P<path>.+)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$")
_ST_DTYPES: dict[str, Any] = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "BF16": "bfloat16"}


@dataclass(frozen=True)
class Adapter:
    folder: Path
    rank: int  # the largest of the modules' ranks (``r``, or ``rank_pattern``'s)
    scale: float  # the scale of a module no pattern matches
    targets: Targets
    a: Mapping[str, np.ndarray]  # module path -> [r, H]
    b: Mapping[str, np.ndarray]  # module path -> [O, r]
    ranks: Mapping[str, int]  # module path -> its rank
    scales: Mapping[str, float]  # module path -> its scale (alpha / r, or alpha / sqrt(r); the patterns applied)


@dataclass(frozen=True)
class PoolLayout:
    """What the pool must look like: module path -> (H, O), plus slots and max rank (from a model or the adapters).

    ``dtype`` is the pool dtype; a model whose targets differ in dtype (an fp16 projection beside an fp32 one)
    gives each module its own in ``module_dtypes``, and ``dtype`` then names them all (``float16,float32``)."""

    modules: Mapping[str, tuple[int, int]]
    num_slots: int
    max_rank: int
    dtype: str
    module_dtypes: Mapping[str, str] | None = None

    def dtype_of(self, path: str) -> str:
        return (self.module_dtypes or {}).get(path, self.dtype)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read a safetensors file with NumPy (including BF16, which ``safetensors.numpy`` cannot load)."""
    import ml_dtypes

    data = path.read_bytes()
    try:
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n], object_pairs_hook=unique_keys)  # a tensor named twice: which is it?
        if not isinstance(header, dict):
            raise TypeError(f"the header is a JSON {type(header).__name__}, not an object")
        body = memoryview(data)[8 + n:]
        items = [(name, info) for name, info in header.items() if name != "__metadata__"]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise InputError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc}); re-save it "
                         "with safetensors") from exc
    out = {}
    for name, info in items:
        kind = info.get("dtype") if isinstance(info, dict) else None
        if kind not in _ST_DTYPES:  # an integer or fp8 LoRA weight is not a float adapter this pool can hold
            raise InputError(f"{path}: tensor {name} has dtype {kind!r}; LoRA weights must be one of "
                             f"{', '.join(_ST_DTYPES)} (re-save the adapter in a float dtype)")
        dt = ml_dtypes.bfloat16 if _ST_DTYPES[kind] == "bfloat16" else _ST_DTYPES[kind]
        try:
            lo, hi = info["data_offsets"]
            out[name] = np.frombuffer(body[lo:hi], dtype=dt).reshape(info["shape"]).copy()
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{path}: tensor {name}'s data does not match its header ({type(exc).__name__}: "
                             f"{exc}); re-save it with safetensors") from exc
    return out


def load_adapter(folder: Path) -> Adapter:
    cfg_path, w_path = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not w_path.exists() and (folder / "adapter_model.bin").is_file():
        raise InputError(f"{folder}: holds adapter_model.bin (a PyTorch pickle: PEFT save_pretrained with "
                         "safe_serialization=False), which pack does not read; convert it: python -c \"import torch; "
                         "from safetensors.torch import save_file; save_file(torch.load('adapter_model.bin', "
                         "weights_only=True), 'adapter_model.safetensors')\" in that folder")
    for p in (cfg_path, w_path):
        if not p.is_file():
            what = "is not a regular file" if p.exists() else "is missing"
            raise InputError(f"{folder}: {p.name} {what}; an adapter folder holds adapter_config.json and "
                             "adapter_model.safetensors (PEFT save_pretrained)")
    cfg = read_config(cfg_path)
    targets = cfg.targets
    a: dict[str, np.ndarray] = {}
    b: dict[str, np.ndarray] = {}
    keys: dict[tuple[str, str], str] = {}  # (module path, "A" or "B") -> the key it came from
    for key, t in read_safetensors(w_path).items():
        m = _KEY.match(key)
        if not m:
            raise InputError(f"{w_path}: tensor {key} is not a base_model.model.<module>.lora_A/lora_B.weight; only "
                             "plain LoRA on linear projections is supported (embedding LoRA, DoRA magnitudes and "
                             "trained biases are not), and leaving it out would change the adapter's outputs")
        path = m["path"]
        if targets and not _peft_targeted(path, targets):
            raise InputError(f"{folder}: tensor {key} adapts module {path!r}, which is not in target_modules "
                             f"{list(targets)}; fix adapter_config.json")
        weights = a if m["ab"] == "A" else b
        if path in weights:  # two adapter names (lora_A.default / lora_A.other), or a plain and a named key
            raise InputError(f"{w_path}: tensors {keys[(path, m['ab'])]} and {key} are both the lora_{m['ab']} "
                             f"weight of module {path!r}; save one adapter per folder")
        weights[path] = t
        keys[(path, m["ab"])] = key
    if not a:
        raise InputError(f"{w_path}: no base_model.model.<module>.lora_A.weight tensors found")
    for path in sorted(set(a) | set(b)):
        if path not in a or path not in b:
            half = "lora_B" if path not in b else "lora_A"
            raise InputError(f"{folder}: module {path!r} has no {half}.weight tensor")
        r = cfg.rank_of(path)
        if a[path].ndim != 2 or b[path].ndim != 2 or a[path].shape[0] != r or b[path].shape[1] != r:
            raise InputError(f"{folder}: tensor base_model.model.{path}.lora_A/B.weight shapes {list(a[path].shape)} "
                             f"and {list(b[path].shape)} do not match [r, H] and [O, r] with r = {r}"
                             + (" (from rank_pattern)" if r != cfg.r else ""))
    ranks = {p: cfg.rank_of(p) for p in a}
    default_scale = cfg.alpha / (math.sqrt(cfg.r) if cfg.rslora else cfg.r)
    return Adapter(folder, max(ranks.values()), default_scale, targets, a, b, ranks, {p: cfg.scale_of(p) for p in a})


def _peft_targeted(path: str, targets: Targets) -> bool:
    """PEFT's ``target_modules`` rule: a regular expression over the whole path, or a list of names the path equals
    or ends with as ``.name`` (a name of an enclosing module, ``self_attn`` for ``...self_attn.q_proj``, is not one)."""
    if isinstance(targets, str):
        return _targeted(path, targets)
    return any(path == t or path.endswith("." + t) for t in targets)


def _targeted(path: str, targets: Targets) -> bool:
    """``--targets`` (and a string ``target_modules``): as ``lora inject`` matches, a dotted component or suffix."""
    if isinstance(targets, str):  # PEFT: a string is a regular expression over the whole module path
        return targets == "all-linear" or re.fullmatch(targets, path) is not None
    parts = path.split(".")
    return any(t in parts or path.endswith("." + t) or path == t for t in targets)


def layout_from_model(model_path: Path) -> PoolLayout:
    """Read the pool layout from an injected ONNX model's ``lora_a.*``/``lora_b.*`` graph inputs: names, [N, H, R] /
    [N, R, O] and each module's dtype (the projection's: targets of one model may differ)."""
    import onnx

    from trtforge.build_engine.core.onnx_io import load_model

    model = load_model(model_path)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    dtypes = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    modules: dict[str, tuple[int, int]] = {}
    module_dtypes: dict[str, str] = {}
    sizes: dict[tuple[int, int], str] = {}  # (N, R) -> the first input that has them
    for name, shape in shapes.items():
        if name.startswith("lora_a."):
            path = name[len("lora_a."):]
            b = shapes.get(spec.input_name("lora_b", path))
            if b is None or len(shape) != 3:
                continue
            if min(shape) < 1 or len(b) != 3 or b[:2] != [shape[0], shape[2]]:
                raise InputError(f"{model_path}: inputs {name} {shape} and lora_b.{path} {b} are not static [N, H, R] "
                                 "and [N, R, O]; re-inject the model with trtforge lora inject")
            sizes.setdefault((shape[0], shape[2]), name)
            modules[path] = (shape[1], b[2])
            module_dtypes[path] = str(onnx.helper.tensor_dtype_to_np_dtype(dtypes[name]))
    if not modules:
        raise InputError(f"{model_path}: has no lora_a.* inputs; run 'trtforge lora inject' first or pass --targets")
    if len(sizes) > 1:
        found = ", ".join(f"{name}: {list(nr)}" for nr, name in sizes.items())
        raise InputError(f"{model_path}: LoRA inputs differ in [slots, rank] ({found}); one pool has one layout: "
                         "re-inject with one --max-rank and --slots")
    (n, r), = sizes
    kinds = sorted(set(module_dtypes.values()))
    return PoolLayout(modules, n, r, ",".join(kinds), module_dtypes if len(kinds) > 1 else None)


def layout_from_adapters(adapters: Sequence[Adapter], targets: Sequence[str] | None, max_rank: int | None,
                         slots: int | None, dtype: str) -> PoolLayout:
    modules: dict[str, tuple[int, int]] = {}
    for ad in adapters:
        for path, a in ad.a.items():
            if targets and not _targeted(path, tuple(targets)):
                raise InputError(f"{ad.folder}: tensor base_model.model.{path}.lora_A.weight adapts a module not in "
                                 f"--targets {list(targets)}")
            hw = (a.shape[1], ad.b[path].shape[0])
            if modules.setdefault(path, hw) != hw:
                raise InputError(f"{ad.folder}: tensor base_model.model.{path}.lora_A/B.weight gives [H, O] = "
                                 f"{list(hw)} but other adapters give {list(modules[path])}")
    r = max_rank if max_rank is not None else max(ad.rank for ad in adapters)
    return PoolLayout(modules, slots if slots is not None else len(adapters), r, dtype)


def pack(adapters: Sequence[Adapter], layout: PoolLayout) -> dict[str, np.ndarray]:
    """The pool tensors (pure: no files). Adapter i fills slot i."""
    import ml_dtypes

    def np_dtype(path: str) -> Any:
        kind = layout.dtype_of(path)
        return ml_dtypes.bfloat16 if kind == "bfloat16" else np.dtype(kind)

    n, r = layout.num_slots, layout.max_rank
    if not 1 <= r <= spec.MAX_RANK:
        raise InputError(f"max rank {r} is outside 1..{spec.MAX_RANK}")
    if not 1 <= n <= spec.MAX_SLOTS:  # checked before allocating n x H x R per module
        raise InputError(f"--slots {n}: give a whole number from 1 to {spec.MAX_SLOTS} (the kernel's slot limit)")
    per_slot = sum((h * r + r * o) * np.dtype(np_dtype(p)).itemsize + 4 for p, (h, o) in layout.modules.items())
    if n * per_slot > _memory_limit():
        raise InputError(f"--slots {n}: the pool would take {n * per_slot / 2**30:.1f} GiB, more than this "
                         f"machine's {_memory_limit() / 2**30:.1f} GiB of available memory; pass fewer --slots")
    if len(adapters) > n:
        raise InputError(f"{len(adapters)} adapters do not fit in {n} slots; pass fewer adapters or more --slots")
    out: dict[str, np.ndarray] = {}
    for path, (h, o) in layout.modules.items():
        out[spec.input_name("lora_a", path)] = np.zeros((n, h, r), np_dtype(path))
        out[spec.input_name("lora_b", path)] = np.zeros((n, r, o), np_dtype(path))
        out[spec.input_name("lora_scales", path)] = np.zeros((n,), np.float32)
    for slot, ad in enumerate(adapters):
        if ad.rank > r:
            worst = max(sorted(ad.ranks), key=ad.ranks.__getitem__)  # rank_pattern may raise one module's rank
            raise InputError(f"{ad.folder}: module {worst!r} has rank r={ad.rank}, above the max rank {r}; pass "
                             f"--max-rank {ad.rank} or larger (and inject with the same)")
        for path, a in ad.a.items():
            if path not in layout.modules:
                raise InputError(f"{ad.folder}: tensor base_model.model.{path}.lora_A.weight adapts module {path!r}, "
                                 f"which the model has no LoRA inputs for; known: {', '.join(sorted(layout.modules))}")
            h, o = layout.modules[path]
            b = ad.b[path]
            rank = ad.ranks[path]
            if a.shape != (rank, h) or b.shape != (o, rank):
                raise InputError(f"{ad.folder}: tensor base_model.model.{path}.lora_A/B.weight shapes {list(a.shape)}/"
                                 f"{list(b.shape)} do not match the pool's [r, {h}] / [{o}, r]")
            out[spec.input_name("lora_a", path)][slot, :, :rank] = _finite(ad, path, "A", a.T, np_dtype(path))
            out[spec.input_name("lora_b", path)][slot, :rank, :] = _finite(ad, path, "B", b.T, np_dtype(path))
            out[spec.input_name("lora_scales", path)][slot] = ad.scales[path]
    return out


def _finite(ad: Adapter, path: str, half: str, weights: np.ndarray, dt: Any) -> np.ndarray:
    """``weights`` in the pool dtype; a NaN/inf, or a value beyond the dtype's range (fp16: 65504), is refused: it
    would turn every output of the tokens using this slot into NaN/inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        converted = weights.astype(dt)
    if not np.isfinite(converted.astype(np.float32)).all():
        raise InputError(f"{ad.folder}: tensor base_model.model.{path}.lora_{half}.weight has NaN/inf values, or "
                         f"values beyond {np.dtype(dt).name}'s range; fix the adapter (or pack into a wider dtype)")
    return converted


def _memory_limit(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Memory a new allocation can get: Linux's MemAvailable (free memory plus the page cache and other memory the
    kernel reclaims on demand), else free physical memory (sysconf), else 16 GiB where the platform does not say.
    (Free memory alone, sysconf's SC_AVPHYS_PAGES, leaves out the cache: on a machine whose RAM had filled with
    cached model files it refused a pool that fitted many times over.)"""
    import os

    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def write_pool(tensors: Mapping[str, np.ndarray], adapters: Sequence[Adapter], path: Path) -> None:
    """Atomically write the pool as safetensors; metadata records which folder sits in which slot."""
    from safetensors.numpy import save

    from trtforge.build_engine.core.fsutil import atomic_path

    meta = {"format": "trtforge-lora-pool-1", "slots": json.dumps([str(a.folder) for a in adapters])}
    blob = save(dict(tensors), metadata=meta)
    header, data = _canonical_header(blob)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(header)
        fh.write(memoryview(blob)[len(blob) - data:])  # no copy of the tensors


def _canonical_header(blob: bytes) -> tuple[bytes, int]:
    """The safetensors header of ``blob`` with its JSON keys sorted (the library writes its metadata map in a random
    order, so two packs of the same adapters differed in bytes), padded with spaces to 8 bytes as the library pads
    it; and the length of the data that follows. Tensor offsets count from the data's start, so they stay valid."""
    n = int.from_bytes(blob[:8], "little")
    text = json.dumps(json.loads(blob[8:8 + n]), sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, len(blob) - 8 - n
