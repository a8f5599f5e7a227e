"""``build_engine``: ONNX + GPU profile -> ``OUTDIR/model.plan`` + ``manifest.json``.

Steps, in order, each failing early with one line: pick the backend able to target the profile's compute capability;
load the model and map the profile's shape ranges onto its inputs (``shapes``); convert precision to the profile's
dtype (``precision``, which folds); parse with the backend's ONNX parser into a strongly typed network (registering
trtforge plugins first when the graph has plugin nodes); configure the builder from the profile; build with a
progress monitor; write the plan, the manifest and the converted ONNX into a temporary folder that replaces OUTDIR
only when everything succeeded (``fsutil.atomic_dir``).

Cost (``bench/build.py``; TensorRT's build is the anchor): the source file is read once (the same bytes are parsed and,
on a worker, hashed); each model is dropped as soon as the next one exists (fp32 source after conversion, the
folded model once serialised, the ONNX bytes once parsed, TensorRT's builder/network/parser once built); model.onnx
is written on a worker thread during TensorRT's build, and the plan is written on a worker while this thread hashes
it. Workers are joined before OUTDIR is published or removed. ``BuildTimings`` records where the time went.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from trtforge.profiles.loader import Profile, Range, load_profile

from ..core import fsutil, interrupt, native_stderr, onnx_io, onnx_save, staging
from ..core.errors import BuildError, InputError, ModelError
from . import plan_stream, worker_priority
from .backend import Backend, prepare_plugin_loading, rtx_compute_capability_enum, select_backend
from .manifest import MANIFEST_NAME, ONNX_NAME, PLAN_NAME, Manifest, PluginInfo, QuantizationInfo, TensorInfo
from .quantized import check_fp8_allowed
from .shapes import InputPlan, plan_shapes, refuse_shape_inputs
from .timings import BuildTimings, _Timer

_log = logging.getLogger("trtforge.build_engine.engine.builder")

# TensorRT DataType member name -> numpy dtype name (bfloat16/fp8 have no numpy type, so trt.nptype cannot be used).
_TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8", "INT32": "int32",
               "INT64": "int64", "BOOL": "bool", "UINT8": "uint8", "FP8": "float8_e4m3fn", "INT4": "int4"}


def _make_logger(trt: ModuleType) -> Any:
    class Logger(trt.ILogger):  # type: ignore[name-defined,misc]
        """Keeps errors for the one-line BuildError; drops TensorRT's warnings/info (they go to --debug users via
        the BuildError cause chain only when something failed)."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            staging.fault_point("build:log")  # test hook: a signal while TensorRT calls back into Python
            if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                self.errors.append(" ".join(msg.split()))

    return Logger()


def _tensor_info(tensor: Any) -> TensorInfo:
    dtype = _TRT_DTYPES.get(tensor.dtype.name, tensor.dtype.name.lower())
    return TensorInfo(tensor.name, dtype, tuple(int(d) for d in tensor.shape))


def _create_network(backend: Backend, builder: Any) -> Any:
    """A strongly typed network: the ONNX tensors' dtypes decide the engine's precision (no FP16/BF16 flags)."""
    trt = backend.module
    if backend.is_rtx:
        return builder.create_network(0)  # TensorRT-RTX networks are always strongly typed
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return builder.create_network(0 if flag is None else 1 << int(flag))


def _configure(backend: Backend, builder: Any, network: Any, profile: Profile, plans: list[InputPlan],
               cc: str) -> Any:
    trt = backend.module
    config = builder.create_builder_config()
    config.builder_optimization_level = profile.builder.optimization_level
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, profile.builder.workspace_mb << 20)
    config.max_aux_streams = profile.builder.aux_streams
    if backend.is_rtx:
        config.num_compute_capabilities = 1
        config.set_compute_capability(rtx_compute_capability_enum(trt, cc), 0)
    net_inputs = {network.get_input(i).name for i in range(network.num_inputs)}
    for k in range(len(profile.shapes)):
        opt_profile = builder.create_optimization_profile()
        for plan in plans:
            if plan.spec.name not in net_inputs:
                continue  # an input the parser dropped (unused)
            r = plan.ranges[k]
            opt_profile.set_shape(plan.spec.name, r.min, r.opt, r.max)
        config.add_optimization_profile(opt_profile)
    return config


def _plugins_used(model: Any) -> list[PluginInfo]:
    """Plugins in the built graph. "python": the IPluginV3 Python plugin, the one ``register_all`` registers with
    both backends (it needs Python at runtime; Triton's TensorRT backend cannot load it)."""
    from trtforge.plugins.lora.spec import PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION

    if PLUGIN_NAME not in {n.op_type for n in model.graph.node}:
        return []
    return [PluginInfo(name=PLUGIN_NAME, namespace=PLUGIN_NAMESPACE, version=PLUGIN_VERSION, implementation="python")]


@dataclass
class _Staged:
    """The folded model and what the build needs to know about it. ``model`` is set to None once it is serialised, so
    its memory (and the fp32 source's, dropped earlier) is freed before TensorRT parses and builds."""

    model: Any
    precision: str
    external: bool
    plugin_nodes: bool
    non_onnx_ops: bool
    plugins: list[PluginInfo]
    as_is: bool = False  # the source file is what is built (nothing converted or folded): parse it, copy it
    quantization: QuantizationInfo | None = None
    source_dir: Path | None = None  # where the weights still on disk (lazy load) are
    external_tensors: frozenset[tuple[int, bytes]] = frozenset()  # the source's external body / Constant tensors


def build_engine(onnx_path: str | Path, profile: Profile | str, out_dir: str | Path, backend: str = "auto",
                 force: bool = False, progress: bool = True, timings: BuildTimings | None = None,
                 dims: Mapping[str, Range] | None = None) -> Manifest:
    """Build an engine for ``profile`` into ``out_dir``; returns the manifest (see module docstring). ``dims``: ranges
    of named dynamic dimensions other than batch/sequence (``shapes.plan_shapes``)."""
    start = time.perf_counter()
    timings = timings if timings is not None else BuildTimings()
    with _Timer(timings, "load"):
        prof = profile if isinstance(profile, Profile) else load_profile(profile)
        fsutil.check_output_folder(out := Path(out_dir))  # before the build: '.' / a mount point cannot be replaced
        if out.exists() and not force:
            raise InputError(f"{out} already exists; pass --force to replace it or choose another output folder")
        chosen = select_backend(backend, prof.hardware.compute_capability)
    with _Timer(timings, "read_source"):
        data = onnx_io.read_model_bytes(onnx_path)
    # I/O-bound work (hashing the source, writing model.onnx and the plan) runs on worker threads: hashlib and file
    # writes release the GIL, so it overlaps conversion, folding and TensorRT's build instead of adding to them. A
    # worker's exception is re-raised where its result is collected, inside atomic_dir, so a failure still leaves
    # nothing behind; leaving the ``with`` waits for every worker before OUTDIR appears or the temporary is removed.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="trtforge-build",
                            initializer=worker_priority.lower_priority) as io_pool:
        # The hash is of the bytes that are built, not of a second read of the file; then of every external data
        # file the model names (streamed, while conversion and TensorRT's build run), so changed weights show.
        head = timings.submit(io_pool, "hash_source", _hash_bytes, data)
        with _Timer(timings, "load"):
            loaded = onnx_io.load(onnx_path, data=data, lazy=True)  # big external weights stay on disk
            del data  # parsed; the hashing worker holds its own reference until it is done
            source_sha = timings.submit(io_pool, "hash_weights", _hash_files, head, loaded.data_files)
            check_fp8_allowed(loaded.model, prof, str(onnx_path))
            plans = plan_shapes(loaded.model, prof, str(onnx_path), dims)
        staged = _convert(onnx_path, loaded, prof, timings)
        with _Timer(timings, "release"):
            del loaded  # the fp32 source: the biggest object of the build
        manifest = _build(onnx_path, staged, plans, prof, chosen, out, force, progress, timings, start, io_pool,
                          source_sha)
    timings.add("other", max(0.0, time.perf_counter() - start - timings.total))
    return manifest


def _hash_bytes(data: bytes) -> Any:
    return hashlib.sha256(data)


def _hash_files(head: Future[Any], files: tuple[Path, ...]) -> str:
    """The manifest's ``onnx_sha256``: sha256 over the model file's bytes, then each external data file's bytes in
    the order the model first names them (streamed in 4 MiB reads). Without external data: the model file's sha256."""
    h = head.result()
    for path in files:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return str(h.hexdigest())


def _convert(onnx_path: str | Path, loaded: onnx_io.LoadedModel, prof: Profile, timings: BuildTimings) -> _Staged:
    """Precision conversion to the profile's type, then folding; the facts the later steps need about the result.

    A quantized model (explicit Q/DQ, from ``trtforge quantize`` or another tool) is built as it is: its Q/DQ pairs
    and scale dtypes are its precision, and converting around them would change the dequantized type of one MatMul
    operand but not the other (TensorRT then refuses the MatMul)."""
    from .quantized import quantization_info

    quant = quantization_info(loaded.model)
    with _Timer(timings, "convert"):
        from ..precision.convert import convert_precision

        if quant is not None:
            converted = loaded.model
        else:
            conversion = convert_precision(loaded.model, prof.precision.dtype, fold=False,
                                           data_dir=loaded.path.parent)
            converted = conversion.model
            del conversion
    with _Timer(timings, "fold"):
        from trtforge.plugins import has_plugin_nodes
        from trtforge.plugins.lora.inject import set_missing_tiles

        from ..passes import fold

        # In place when conversion made a new model; a model already in the profile's precision (or quantized, built
        # as is) comes back as ``loaded.model`` itself, which nothing else reads after this either.
        folded = fold(converted, inplace=True)
        model, plugin_nodes = folded.model, has_plugin_nodes(folded.model)  # plugin nodes with no tile: the profile's
        tiled = plugin_nodes and set_missing_tiles(model, prof.lora.tile) > 0
        unchanged = converted is loaded.model and not folded.report.rules and not tiled
        del converted, folded
        precision = quant["mode"] if quant is not None else _effective_precision(model, prof.precision.dtype)
        if quant is None and precision == "fp32":  # debug only: the manifest and the summary line say fp32
            _log.debug("%s stays float32: none of its ops admits %s at the model's opset (Conv before 22 for bf16) "
                       "or the policy keeps them; re-export at a newer opset", onnx_path, prof.precision.dtype)
        elif quant is None and precision != prof.precision.dtype:  # debug: the summary line and manifest say it
            _log.debug("%s is already %s; building it as is (profile %r asks for %s; converting between 16-bit types "
                       "would round twice)", onnx_path, precision, prof.name, prof.precision.dtype)
        # The source's size decides external data (model.ByteSize() on a large model costs as much as a save).
        external = loaded.external_data or Path(onnx_path).stat().st_size >= 1_500_000_000
        as_is = loaded.external_data and unchanged and _same_as_file(model, Path(onnx_path))
        return _Staged(model=model, precision=precision, external=external, plugin_nodes=plugin_nodes,
                       non_onnx_ops=not plugin_nodes and _has_non_onnx_ops(model), plugins=_plugins_used(model),
                       as_is=as_is, source_dir=loaded.path.parent, external_tensors=loaded.external_tensors,
                       quantization=QuantizationInfo.from_json(quant, onnx_path) if quant is not None else None)


def _same_as_file(model: Any, path: Path) -> bool:
    """Whether ``model`` has the nodes (in order) and initializers of the file at ``path`` (read without its
    external data): loading sorts an out-of-order graph, and then the file is not what would be built."""
    source = onnx_io.load_structure(path).model
    return ([tuple(n.output) for n in source.graph.node] == [tuple(n.output) for n in model.graph.node]
            and [t.name for t in source.graph.initializer] == [t.name for t in model.graph.initializer])


def _build(onnx_path: str | Path, staged: _Staged, plans: list[InputPlan], prof: Profile, chosen: Backend,
           out: Path, force: bool, progress: bool, timings: BuildTimings, start: float, io_pool: ThreadPoolExecutor,
           source_sha: Future[str]) -> Manifest:
    """Everything after folding (see ``build_engine``); ``io_pool`` runs the hashing and the file writes."""
    cc = prof.hardware.compute_capability
    writes: list[Future[Any]] = []
    with fsutil.atomic_dir(out, force=force) as tmp:
        try:
            serialized, inputs, outputs = _tensorrt(onnx_path, staged, plans, prof, chosen, tmp, progress, timings,
                                                    io_pool, writes)
            with _Timer(timings, "write_plan"):
                plan_sha = plan_stream.write_plan(serialized, tmp / PLAN_NAME, io_pool, writes, timings)
                del serialized
                for w in writes:
                    w.result()  # model.onnx (written during the build) and the plan: re-raise a failed write
            with _Timer(timings, "manifest"):
                manifest = Manifest.make(
                    backend_name=chosen.name, backend_version=chosen.version, profile=prof.name,
                    precision=staged.precision, compute_capabilities=_built_ccs(chosen, cc),
                    inputs=inputs, input_plans=plans, outputs=outputs, plugins=staged.plugins,
                    onnx_sha256=source_sha.result(), plan_sha256=plan_sha,
                    build_seconds=time.perf_counter() - start, quantization=staged.quantization,
                )
                # Plain write: the temporary folder becomes OUTDIR only by atomic_dir's rename, so nothing half-written
                # is ever visible; an fsync here would flush the whole plan to disk and cost more than parsing.
                (tmp / MANIFEST_NAME).write_text(manifest.dumps())
        finally:
            # Never let atomic_dir publish or remove the folder while a worker still writes into it.
            wait(writes)
    return manifest


def _copy_source(source: Path, dest: Path) -> None:
    """model.onnx as a copy of the source and its external data (``model.onnx.data``, offsets kept)."""
    onnx_save.save_with_source_data(onnx_io.load_structure(source).model, source, dest)


def _write_onnx(onnx_path: Path, onnx_bytes: bytes, timings: BuildTimings) -> None:
    """Worker task during TensorRT's parse and build: write model.onnx; its duration goes to ``timings.background``."""
    t0 = time.perf_counter()
    onnx_path.write_bytes(onnx_bytes)
    timings.add_background("write_onnx", time.perf_counter() - t0)


def _tensorrt(onnx_path: str | Path, staged: _Staged, plans: list[InputPlan], prof: Profile, chosen: Backend,
              tmp: Path, progress: bool, timings: BuildTimings, io_pool: ThreadPoolExecutor,
              writes: list[Future[Any]]) -> tuple[Any, list[TensorInfo], list[TensorInfo]]:
    """Serialise the model (model.onnx is written on a worker), parse, configure and build; returns the serialised
    plan (``IHostMemory``) and the network's inputs and outputs. Everything else made here (the ONNX bytes, the
    builder, network, parser and config, which hold copies of the weights) is released before returning."""
    trt = chosen.module
    cc = prof.hardware.compute_capability
    onnx_path_built = tmp / ONNX_NAME
    with _Timer(timings, "serialize"):
        onnx_bytes: bytes | None = None
        parse_path = onnx_path_built
        if staged.as_is:
            # Nothing was converted or folded: TensorRT parses the source file, and model.onnx (with its data, a
            # byte copy) is written on a worker meanwhile instead of being serialised from memory first.
            parse_path = Path(onnx_path)
            writes.append(timings.submit(io_pool, "copy_onnx", _copy_source, parse_path, onnx_path_built))
        elif staged.external:
            onnx_save.save_model(staged.model, onnx_path_built, external_data=True, source_dir=staged.source_dir,
                                 external_tensors=staged.external_tensors)
        else:
            # Serialise once: the same bytes go to TensorRT's parser and (on a worker) to model.onnx.
            onnx_bytes = staged.model.SerializeToString()
        staged.model = None  # serialised: free the folded model now
        if onnx_bytes is not None:  # model.onnx is written while TensorRT parses and builds
            writes.append(io_pool.submit(_write_onnx, onnx_path_built, onnx_bytes, timings))
    with _Timer(timings, "configure"):
        if staged.plugin_nodes:
            prepare_plugin_loading(chosen)
            from trtforge.plugins import register_all

            register_all(trt)
        elif staged.non_onnx_ops:
            # The parser looks any unknown op up as a plugin; without the link that lookup aborts the process.
            prepare_plugin_loading(chosen)
        logger = _make_logger(trt)
    # TensorRT calls back into Python here (the logger, plugin creators) and swallows their exceptions ("Exception
    # caught in log()", a stack on stderr): signals wait for the block's end, as in the build; fd 2 is held too,
    with _Timer(timings, "parse"), native_stderr.held() as cerr, interrupt.deferred():  # the parser prints failures
        builder = trt.Builder(logger)
        network = _create_network(chosen, builder)
        parser = trt.OnnxParser(network, logger)
        # From memory when possible (model.onnx may still be being written); a path only for external data.
        parsed = parser.parse_from_file(str(parse_path)) if onnx_bytes is None else parser.parse(onnx_bytes)
        cerr.keep = parsed
    if not parsed:
        first = parser.get_error(0) if parser.num_errors else None
        detail = (f"node {first.node_name() or first.node()} ({first.node_operator()}): {first.desc()}"
                  if first is not None else (logger.errors[0] if logger.errors else "unknown error"))
        detail += "".join(f" ({ln})" for ln in cerr.lines)
        # Bad input (exit 2), not a failed check: the model uses something this TensorRT does not support.
        raise ModelError(f"{onnx_path}: {chosen.name} {chosen.version} cannot parse the model: {detail}; export it "
                         "with ops this TensorRT supports")
    with _Timer(timings, "configure"), interrupt.deferred():
        del onnx_bytes  # parsed (the parser keeps what it needs); the writing worker holds its own reference
        refuse_shape_inputs(network, str(onnx_path))
        config = _configure(chosen, builder, network, prof, plans, cc)
        if staged.plugin_nodes:
            from trtforge.plugins import configure_builder

            configure_builder(trt, config)  # aliased plugin I/O preview feature
        inputs = [_tensor_info(network.get_input(i)) for i in range(network.num_inputs)]
        outputs = [_tensor_info(network.get_output(i)) for i in range(network.num_outputs)]
        monitor = make_monitor(trt, progress)  # always: it is how SIGINT/SIGTERM cancel the build
    with _Timer(timings, "build"), interrupt.deferred():  # raised after TensorRT returns, not inside its callbacks
        config.progress_monitor = monitor
        monitor.start()
        try:
            serialized = plan_stream.run_build(trt, builder, network, config, tmp / PLAN_NAME)
        finally:
            monitor.stop()
    if serialized is None:
        detail = logger.errors[0] if logger.errors else "no error message"
        raise BuildError(f"{onnx_path}: {chosen.name} {chosen.version} failed to build for profile "
                         f"{prof.name!r} (compute capability {cc}): {detail}")
    with _Timer(timings, "release"):
        # The plan (IHostMemory) does not depend on them; their copies of the weights are freed before the plan is
        # hashed and written, which lowers the peak.
        del parser, network, config, builder, monitor
    return serialized, inputs, outputs


def _has_non_onnx_ops(model: Any) -> bool:
    import onnx

    return any(not onnx.defs.has(n.op_type, n.domain if n.domain != "ai.onnx" else "") for n in model.graph.node)


def _effective_precision(model: Any, wanted: str) -> str:
    """The 16-bit type that holds most of the weights: the profile's, unless the model came in the other one; "fp32"
    when no tensor is in a 16-bit type at all (every op stayed float32, e.g. Conv before opset 22 admits no bf16 and
    MatMul before opset 13 neither: the engine is float32, whatever the profile asks)."""
    from onnx import TensorProto

    low = {TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16"}
    size = {"fp16": 0, "bf16": 0}
    for t in model.graph.initializer:
        key = low.get(t.data_type)
        if key is not None:
            size[key] += math.prod(t.dims)
    g = model.graph
    values = [v.type.tensor_type.elem_type for v in [*g.input, *g.output, *g.value_info]]
    values += [a.i for n in g.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    if not any(size.values()) and not set(values) & set(low):
        return "fp32"
    other = "bf16" if wanted == "fp16" else "fp16"
    return other if size[other] > size[wanted] else wanted


def _built_ccs(backend: Backend, cc: str) -> list[str]:
    from .backend import normalize_cc

    return [normalize_cc(cc)]


def make_monitor(trt: ModuleType, show: bool = True) -> Any:
    from .progress import make_progress_monitor

    return make_progress_monitor(trt, show)
