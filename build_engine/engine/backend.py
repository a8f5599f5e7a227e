"""TensorRT backend selection: full ``tensorrt`` or ``tensorrt_rtx``.

- Full TensorRT (``tensorrt``, 10.x/11.x) installs only from NVIDIA's package index or NGC containers. It builds for
  the GPU it runs on, so its targets are the compute capabilities of the local GPUs (none on a CPU-only machine).
- TensorRT for RTX (``tensorrt_rtx``, PyPI) builds ahead of time on a CPU-only machine for the compute capabilities
  in its ``ComputeCapability`` enum (8.0, 8.6, 8.9, 12.0, ...), never 9.0 (Hopper).

``auto`` prefers full TensorRT when it is importable and can target the requested compute capability, else
TensorRT-RTX when it can, else raises ``BackendError`` that says what to install.

Heavy modules (tensorrt, tensorrt_rtx, cuda) are imported inside functions only.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..core.errors import BackendError

_log = logging.getLogger("trtforge.build_engine.engine.backend")

CHOICES = ("auto", "tensorrt", "tensorrt-rtx")
# CLI spelling -> module / manifest name.
_MODULES = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}

INSTALL_TRT = (
    "install full TensorRT from NVIDIA's index (pip install tensorrt --extra-index-url https://pypi.nvidia.com) "
    "or use an NGC TensorRT container (nvcr.io/nvidia/tensorrt) on a machine with that GPU"
)
# What TensorRT-RTX 1.7.1 (the oldest pyproject accepts) targets ahead of time, its ``ComputeCapability`` enum: the
# rule a machine without it plans by (``build-matrix``'s driver); one with it installed reads the enum itself.
RTX_TARGETS = ("7.5", "8.0", "8.6", "8.9", "12.0", "12.1")
INSTALL_RTX = ("pip install 'trtforge[rtx]' (TensorRT for RTX builds SM " + "/".join(RTX_TARGETS)
               + " engines without a GPU)")



@dataclass(frozen=True)
class Backend:
    """A TensorRT flavour found on this machine.

    ``module`` is the imported ``tensorrt`` / ``tensorrt_rtx`` module; ``targets`` the compute capabilities
    ("8.0", "8.6", ...) it can build engines for here; ``can_run`` whether this machine can deserialize and run the
    engines it builds (needs a CUDA GPU of a targetable compute capability).
    """

    name: str
    version: str
    module: ModuleType = field(repr=False, compare=False)
    targets: tuple[str, ...]
    can_run: bool

    @property
    def is_rtx(self) -> bool:
        return self.name == "tensorrt_rtx"

    @property
    def cli_name(self) -> str:
        return "tensorrt-rtx" if self.is_rtx else "tensorrt"

    def can_target(self, compute_capability: str) -> bool:
        return normalize_cc(compute_capability) in self.targets


def normalize_cc(cc: str | float) -> str:
    """'8', '8.0', 80, 'sm80', 'SM_86' -> '8.0' / '8.6'. Raises BackendError for anything else."""
    text = str(cc).strip().lower().removeprefix("sm").lstrip("_")
    try:
        if "." in text:
            major, minor = text.split(".", 1)
            return f"{int(major)}.{int(minor)}"
        value = int(text)
    except ValueError as exc:
        raise BackendError(f"compute capability {cc!r} is not like '8.0' or 'sm86'; fix the profile") from exc
    if value < 10:
        return f"{value}.0"
    return f"{value // 10}.{value % 10}"


@functools.lru_cache(maxsize=1)
def local_gpu_compute_capabilities() -> tuple[str, ...]:
    """Compute capabilities of the CUDA GPUs visible here, through cuda-python's driver API; () when there is none.

    Never raises: a missing cuda-python, a missing driver (``libcuda.so``) or zero devices all mean "no GPU".
    """
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found]
    except Exception:
        try:
            from cuda import cuda as driver  # type: ignore[import-not-found,no-redef]  # cuda-python < 12.6
        except Exception:
            return ()
    try:
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return ()
        err, count = driver.cuDeviceGetCount()
        if int(err) != 0:
            return ()
        attr = driver.CUdevice_attribute
        out: list[str] = []
        for ordinal in range(int(count)):
            err, dev = driver.cuDeviceGet(ordinal)
            if int(err) != 0:
                continue
            e1, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
            e2, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
            if int(e1) == 0 and int(e2) == 0:
                out.append(f"{int(major)}.{int(minor)}")
        return tuple(dict.fromkeys(out))
    except Exception:  # driver library not found, driver too old, ...
        return ()


def rtx_compute_capability_enum(module: ModuleType, cc: str) -> Any:
    """``trt.ComputeCapability.SM86`` for '8.6'; raises BackendError when the module has no such member."""
    name = "SM" + normalize_cc(cc).replace(".", "")
    enum = getattr(module, "ComputeCapability", None)
    member = getattr(enum, name, None) if enum is not None else None
    if member is None:
        raise BackendError(f"{module.__name__} {module.__version__} cannot target compute capability {cc}; "
                           f"use a profile whose compute capability it lists, or {INSTALL_TRT}")
    return member


def _cc_key(cc: str) -> tuple[int, int]:
    try:
        major, minor = normalize_cc(cc).split(".")
        return int(major), int(minor)
    except BackendError:
        return (0, 0)


def _rtx_targets(module: ModuleType) -> tuple[str, ...]:
    enum = getattr(module, "ComputeCapability", None)
    members = getattr(enum, "__members__", {}) if enum is not None else {}
    out = []
    for name in members:
        if name.startswith("SM") and name[2:].isdigit():
            out.append(normalize_cc(name[2:]))
    return tuple(sorted(set(out), key=_cc_key))


def _describe(name: str, module: ModuleType) -> Backend:
    local = local_gpu_compute_capabilities()
    # Full TensorRT builds for the device it runs on (TensorRT >= 8.6 keeps sm 7.5+).
    targets = _rtx_targets(module) if name == "tensorrt_rtx" else tuple(cc for cc in local if _cc_key(cc) >= (7, 5))
    can_run = any(cc in targets for cc in local)
    return Backend(name=name, version=str(getattr(module, "__version__", "unknown")), module=module,
                   targets=targets, can_run=can_run)


def _import(module_name: str) -> ModuleType | None:
    try:
        return importlib.import_module(module_name)
    except Exception:  # ImportError, or a broken install (missing shared library -> OSError)
        return None


def available_backends() -> list[Backend]:
    """Every backend importable here, full TensorRT first."""
    found = []
    for module_name in ("tensorrt", "tensorrt_rtx"):
        module = _import(module_name)
        if module is not None:
            found.append(_describe(module_name, module))
    return found


def select_backend(choice: str = "auto", compute_capability: str | None = None) -> Backend:
    """Pick the backend for ``choice`` that can build for ``compute_capability`` (any, when None)."""
    if choice not in CHOICES:
        raise BackendError(f"unknown backend {choice!r}; choose one of {', '.join(CHOICES)}")
    cc = normalize_cc(compute_capability) if compute_capability is not None else None
    where = f" for compute capability {cc}" if cc else ""
    if choice != "auto":
        module_name = _MODULES[choice]
        module = _import(module_name)
        if module is None:
            how = INSTALL_TRT if choice == "tensorrt" else INSTALL_RTX
            raise BackendError(f"backend {choice} is not installed (cannot import {module_name}); {how}")
        backend = _describe(module_name, module)
        if cc is not None and not backend.can_target(cc):
            raise BackendError(_cannot_target(backend, cc))
        return backend
    backends = available_backends()
    for backend in backends:
        if cc is None or backend.can_target(cc):
            return backend
    if not backends:
        raise BackendError(f"no TensorRT backend is installed{where}; {INSTALL_RTX}, or {INSTALL_TRT}")
    raise BackendError("; ".join(_cannot_target(b, cc or "?") for b in backends))


def _cannot_target(backend: Backend, cc: str) -> str:
    targets = ", ".join(backend.targets) or "none"
    if backend.is_rtx:
        note = " (Hopper: H100/H200)" if cc.startswith("9.") else ""
        fix = f"full TensorRT is needed: {INSTALL_TRT}" if _cc_key(cc) >= (7, 5) else "no current TensorRT supports it"
        return (f"{backend.name} {backend.version} cannot target compute capability {cc}{note}; it targets {targets}; "
                f"{fix}")
    return (f"{backend.name} {backend.version} builds only for the local GPU (targets here: {targets}) and cannot "
            f"target compute capability {cc}; run the build on a machine with that GPU"
            + ("" if cc.startswith("9.") else f", or for {'/'.join(RTX_TARGETS)} use --backend tensorrt-rtx "
                                              f"({INSTALL_RTX})"))


# --- plugin loading -------------------------------------------------------------------------------------------------

_LINK_NAME = "libtensorrt_rtx.so"
_SONAME = "libtensorrt_rtx.so.1"
_notice_printed = False


def rtx_libs_dir(backend: Backend) -> Path | None:
    """The wheel's ``tensorrt_rtx_libs`` folder (beside the ``tensorrt_rtx`` package), or None if not a pip install."""
    module_file = getattr(backend.module, "__file__", None)
    if not module_file:
        return None
    libs = Path(module_file).resolve().parent.parent / "tensorrt_rtx_libs"
    return libs if (libs / _SONAME).exists() else None


def _publish_link(link: Path) -> None:
    """Create ``link -> libtensorrt_rtx.so.1`` without a moment where ``link`` is missing or half-made: a symlink under
    a name unique to this process, then ``os.replace`` onto ``link`` (atomic; a concurrent process doing the same
    replaces one good link with another, and a dangling link is replaced, never unlinked first)."""
    tmp = link.with_name(f".{_LINK_NAME}.{os.getpid()}.{id(link)}.tmp")
    try:
        os.symlink(_SONAME, tmp)
        os.replace(tmp, link)
    finally:
        if tmp.is_symlink():
            tmp.unlink()


def prepare_plugin_loading(backend: Backend, libs_dir: Path | None = None) -> None:
    """Make sure TensorRT-RTX's ONNX parser can load plugins.

    The ``tensorrt-rtx`` wheel ships ``libtensorrt_rtx.so.1`` but the parser ``dlopen``s ``libtensorrt_rtx.so``
    when it meets a plugin node; without that file the process aborts inside ``parse_from_file``. Create the link
    ``libtensorrt_rtx.so -> libtensorrt_rtx.so.1`` when the folder is writable (one notice on stderr per process),
    else raise BackendError with the exact command. No-op for full TensorRT and for non-wheel installs.
    """
    global _notice_printed
    if not backend.is_rtx:
        return
    libs = libs_dir if libs_dir is not None else rtx_libs_dir(backend)
    if libs is None:
        return
    link = libs / _LINK_NAME
    if link.exists():
        return
    command = f"ln -sf {_SONAME} {link}"
    if not os.access(libs, os.W_OK):
        raise BackendError(
            f"{libs} lacks {_LINK_NAME}, which TensorRT-RTX's ONNX parser needs to load plugins, and the folder is not "
            f"writable; run: {command}"
        )
    try:
        _publish_link(link)
    except OSError as exc:
        if link.exists():  # another process won a race we did not see coming: its link is as good as ours
            return
        raise BackendError(f"cannot create {link} ({exc.strerror}); run: {command}") from exc
    if not _notice_printed:
        _notice_printed = True
        _log.debug("created %s -> %s so TensorRT-RTX's ONNX parser can load plugins", link, _SONAME)
