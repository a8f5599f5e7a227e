"""Plan the matrix: one cell per (model, profile), its backend, the cluster resource it needs and its cache key.

The cache key is a sha256 over everything that decides the engine's bytes: the source model's bytes (and its
external-data files, each with the location the model names it by), the pipeline options, the profile's full content
except what only labels it (its name, description and the file it was read from), the backend and its version,
trtforge's version, and for a LoRA pipeline whether the plugin's output aliases its input (``TRTFORGE_LORA_ALIAS``,
which changes the engine). Nothing else enters it: moving or renaming the model, the profile or the matrix file, or
touching their mtimes, keeps the key (the cell folder is named after the matrix's model name and the profile's name).
A cell whose folder already holds a build with the same key (and the files its cell.json records) is not rebuilt.

Resources (Ray custom resources, see ``node_resources``): a TensorRT-RTX cell runs on any node advertising
``trtforge_rtx``; a full-TensorRT cell only on a node whose GPU has the profile's compute capability
(``trtforge_cc_9_0`` for 9.0), because full TensorRT builds for the GPU it runs on.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from trtforge.profiles.loader import Profile, list_profiles, load_profile

from ..core import env
from ..core.errors import TrtforgeError
from ..engine.backend import RTX_TARGETS, normalize_cc
from .spec import MatrixSpec, ModelEntry

RESOURCE_RTX = "trtforge_rtx"
# Profile fields that label it and never reach the builder (the cell folder carries the name).
PROFILE_LABELS = frozenset({"name", "description", "source"})
_DISTS = {"tensorrt_rtx": ("tensorrt-rtx", "tensorrt_rtx"), "tensorrt": ("tensorrt", "tensorrt-cu12", "tensorrt_cu13")}


def cc_resource(cc: str) -> str:
    return "trtforge_cc_" + normalize_cc(cc).replace(".", "_")


@dataclass(frozen=True)
class Cell:
    """One engine to build. ``refusal`` is set when the cell cannot be built anywhere this run can reach."""

    model: ModelEntry
    profile_ref: str
    profile: Profile | None
    backend: str  # tensorrt | tensorrt_rtx (resolved), or "" when refused
    resource: str
    key: str
    refusal: str = ""

    @property
    def label(self) -> str:
        return f"{self.model.name}/{self.profile_name}"

    @property
    def profile_name(self) -> str:
        return self.profile.name if self.profile is not None else Path(self.profile_ref).stem

    def outdir(self, root: Path) -> Path:
        return root / self.model.name / self.profile_name


def backend_version(module_name: str) -> str:
    """The installed distribution's version (no import of TensorRT), or "absent"."""
    for dist in _DISTS.get(module_name, (module_name,)):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "absent"


def trtforge_version() -> str:
    try:
        return version("trtforge")
    except PackageNotFoundError:
        return "0.0.0+unknown"


def resolve_backend(choice: str, cc: str) -> str:
    """Which backend builds a cell: by rule, so a driver without TensorRT can plan a cluster's work."""
    cc = normalize_cc(cc)
    if choice == "tensorrt-rtx":
        return "tensorrt_rtx"
    if choice == "tensorrt":
        return "tensorrt"
    return "tensorrt_rtx" if cc in RTX_TARGETS else "tensorrt"


def model_digest(path: Path) -> str:
    """sha256 of the model file's bytes and of every external-data file it names, with the location the model
    names it by (streamed, in a stable order); independent of the model's own path and name."""
    h = hashlib.sha256()
    for label, f in [("", path), *((os.path.relpath(f, path.parent), f) for f in external_files(path))]:
        h.update(label.encode() + b"\0")  # the model file's own name is not content: "" (a rename keeps the key)
        part = hashlib.sha256()
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                part.update(chunk)
        h.update(part.digest())  # fixed-size per-file digests: no two file sets hash the same stream
    return h.hexdigest()


def external_files(path: Path) -> list[Path]:
    """The external-data files an ONNX model names (sorted, deduplicated), read from the graph without its data."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a readable model: the worker's load reports it with the contract's one line
        return []
    from ..core.onnx_io import external_locations

    # every tensor's: initializers of every graph, Constant values (bodies too) and model-local functions' tensors
    return [path.parent / n for n in sorted(set(external_locations(model)))]


def check_sources(spec: MatrixSpec) -> None:
    """Every model's external-data files can be read (InputError naming the model and the file otherwise): a
    missing one ended the whole matrix, dry runs too, as 'internal error: FileNotFoundError' (exit 3), once
    OUTROOT and its lock file were made."""
    from ..core.errors import InputError

    for m in spec.models:
        for f in external_files(m.path):
            try:
                with open(f, "rb"):
                    pass
            except OSError as exc:
                raise InputError(f"{spec.source}: model {m.name!r} ({m.path}) keeps weights in external data "
                                 f"{os.path.relpath(f, m.path.parent)!r}, which cannot be read ({exc.strerror}); "
                                 "put that file beside the model (or fix its location)") from exc


def cell_key(model_sha: str, entry: ModelEntry, profile: Profile, backend: str) -> str:
    content = {k: v for k, v in asdict(profile).items() if k not in PROFILE_LABELS}
    payload: dict[str, Any] = {"model": model_sha, "pipeline": entry.pipeline.to_json(), "profile": content,
                               "backend": backend, "backend_version": backend_version(backend),
                               "trtforge": trtforge_version()}
    if entry.pipeline.lora is not None and env.get_flag(env.LORA_ALIAS):
        # The plugin's output aliases y: another engine (workers build under the driver's setting, see executors).
        # Only when on, so the keys of default builds stay what they were.
        payload["lora_alias"] = True
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def folder_name_problem(name: str) -> str:
    """Why a profile's ``name`` cannot name its cells' folder ``OUTROOT/<model>/<name>`` ("" when it can): one path
    component, not hidden (``OUTROOT/<model>/.*`` holds staging leftovers, removed by the next run)."""
    if name and not name.startswith(".") and not any(c in name for c in "/\\\0"):
        return ""
    return (f"its name {name!r} cannot name a cell folder (OUTROOT/<model>/<profile name>); give the profile a name "
            "without / or \\ that does not start with '.'")


def profile_file(spec: MatrixSpec, ref: str) -> Path | None:
    """The file a matrix profile names, relative to the matrix file; None for a built-in name (or an unknown one,
    refused with suggestions). As ``load_profile`` tells them apart: built-in names win, then a path ends in .toml,
    holds a / or \\, or names an existing file. (Only .toml refs were read relative to the matrix file: ``sub/gpu``
    was read from the working directory, and its cells' folder name, the profile's ``name``, was not checked against
    the other profiles': two profiles named a10 both published OUTROOT/<model>/a10, both reported built.)"""
    if ref in list_profiles():
        return None
    path = spec.source.parent / ref
    return path.resolve() if ref.endswith(".toml") or "/" in ref or "\\" in ref or path.is_file() else None


def plan_cells(spec: MatrixSpec) -> list[Cell]:
    """Every (model, profile) cell with backend, resource and key; profiles that fail to load refuse their cells."""
    profiles: dict[str, Profile | str] = {}
    for ref in dict.fromkeys(p for m in spec.models for p in m.profiles):
        file = profile_file(spec, ref)
        target = ref if file is None else str(file)
        try:
            # never the working directory's file of that name: not beside the matrix file, a bare name is a built-in
            profiles[ref] = load_profile(target, bare_file=False)
        except TrtforgeError as exc:
            profiles[ref] = exc.message
    cells: list[Cell] = []
    for entry in spec.models:
        sha = model_digest(entry.path)
        for ref in entry.profiles:
            prof = profiles[ref]
            if isinstance(prof, str):
                cells.append(Cell(entry, ref, None, "", "", "", refusal=prof))
                continue
            bad_name = folder_name_problem(prof.name)  # check_outroot refuses such a matrix before planning
            if bad_name:
                cells.append(Cell(entry, ref, None, "", "", "", refusal=f"profile {ref}: {bad_name}"))
                continue
            cc = prof.hardware.compute_capability
            backend = resolve_backend(spec.backend, cc)
            if backend == "tensorrt_rtx" and normalize_cc(cc) not in RTX_TARGETS:
                cells.append(Cell(entry, ref, prof, "", "", "", refusal=(
                    f"TensorRT-RTX cannot target compute capability {cc} (profile {prof.name}; it targets "
                    f"{', '.join(RTX_TARGETS)}); set backend = \"tensorrt\" (or \"auto\", which picks it for this "
                    "profile) and give the cluster a node with full TensorRT and that GPU")))
                continue
            resource = RESOURCE_RTX if backend == "tensorrt_rtx" else cc_resource(cc)
            cells.append(Cell(entry, ref, prof, backend, resource, cell_key(sha, entry, prof, backend)))
    return cells


def node_resources() -> dict[str, float]:
    """The Ray custom resources this node should advertise: one ``trtforge_rtx`` slot per CPU core when TensorRT-RTX
    is installed, and ``trtforge_cc_X_Y`` per local GPU when full TensorRT is (it builds for the GPU it runs on)."""
    import os

    from ..engine.backend import available_backends, local_gpu_compute_capabilities

    out: dict[str, float] = {}
    names = {b.name for b in available_backends()}
    if "tensorrt_rtx" in names:
        out[RESOURCE_RTX] = float(os.cpu_count() or 1)
    if "tensorrt" in names:
        for cc in local_gpu_compute_capabilities():
            out[cc_resource(cc)] = out.get(cc_resource(cc), 0.0) + 1.0
    return out


def describe(cell: Cell) -> dict[str, Any]:
    return {"model": cell.model.name, "profile": cell.profile_name, "backend": cell.backend,
            "resource": cell.resource, "key": cell.key}
