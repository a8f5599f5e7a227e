"""Polygraphy's ``TrtRunner`` over an engine folder (``trtforge diff`` with an engine on one side).

Running a plan needs the TensorRT flavour that built it, the module Polygraphy imports to be that flavour, and a GPU
of a compute capability the plan targets. Each is checked before Polygraphy is asked, so a missing one is one
``InputError`` that names the engine folder and the fix: without the checks a TensorRT-RTX plan was handed to full
TensorRT (Polygraphy picks ``tensorrt`` unless ``POLYGRAPHY_USE_TENSORRT_RTX=1``), and a machine without TensorRT
got Polygraphy's advice to auto-install ``tensorrt`` (PyPI's placeholder) under "check the models run in
onnxruntime". The run itself (a GPU) is not exercised in CI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import InputError


def engine_runner(engine_dir: Path, name: str) -> Any:
    """A ``TrtRunner`` over ``engine_dir/model.plan``; ``InputError`` when this machine cannot run the plan."""
    from ..engine.manifest import Manifest

    manifest = Manifest.load(engine_dir)
    _check_can_run(engine_dir, manifest)
    try:
        from polygraphy.backend.common import BytesFromPath
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner
        from polygraphy.mod.trt_importer import lazy_import_trt
    except ImportError as exc:
        raise InputError(f"{engine_dir}: comparing an engine needs polygraphy's TensorRT backend ({exc})") from exc
    trt = lazy_import_trt()
    if manifest.plugins:
        from ..engine.polygraphy_plugin import register_plugins

        register_plugins(trt)
    return TrtRunner(EngineFromBytes(BytesFromPath(str(engine_dir / manifest.plan))), name=name)


def check_engine_names(engine_dir: Path, onnx_path: Path, names: tuple[list[str], list[str]],
                       extra_inputs: bool) -> None:
    """An engine folder against a model whose (sorted inputs, outputs) are ``names``: the same output names (and
    input names unless ``extra_inputs``), read from the manifest, as ``diff`` asks of two models; without it an
    output only one side had was left out of the comparison."""
    from ..engine.manifest import Manifest

    man = Manifest.load(engine_dir)
    ie, oe = sorted(t.name for t in man.inputs), [t.name for t in man.outputs]
    im, om = names
    if sorted(oe) != sorted(om) or (ie != im and not extra_inputs):
        raise InputError(f"{engine_dir} and {onnx_path} differ in inputs/outputs: the engine has inputs {ie} outputs "
                         f"{oe}, {onnx_path.name} has inputs {im} outputs {om}; diff needs the same names")


def _check_can_run(engine_dir: Path, manifest: Any) -> None:
    from ..engine.backend import available_backends, local_gpu_compute_capabilities
    from ..engine.polygraphy_plugin import polygraphy_uses_rtx

    built_by, targets = manifest.backend, manifest.compute_capabilities
    instead = f"or compare {engine_dir / 'model.onnx'} (the model the plan was built from) in onnxruntime"
    if not any(b.name == built_by.name for b in available_backends()):
        raise InputError(f"{engine_dir}: its plan was built by {built_by.name} {built_by.version}, which is not "
                         f"installed here; run diff where it is and a GPU of sm {', '.join(targets)} exists, {instead}")
    rtx = built_by.name == "tensorrt_rtx"
    if rtx != polygraphy_uses_rtx():
        raise InputError(f"{engine_dir}: its plan was built by {built_by.name}, but Polygraphy runs "
                         f"{'tensorrt' if rtx else 'tensorrt_rtx'} here; set POLYGRAPHY_USE_TENSORRT_RTX="
                         f"{1 if rtx else 0} and rerun")
    local = local_gpu_compute_capabilities()
    if not any(cc in targets for cc in local):
        found = f"this machine's GPUs are sm {', '.join(local)}" if local else "this machine has no CUDA GPU"
        raise InputError(f"{engine_dir}: its plan runs on a GPU of sm {', '.join(targets)} and {found}; run diff "
                         f"on such a GPU, {instead}")
