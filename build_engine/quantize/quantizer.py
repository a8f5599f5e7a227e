"""``quantize(model, config, calib)``: select, calibrate, migrate, insert Q/DQ, fold (the steps, in order).

1. ``targets.select``: projections to quantize and the reasons the others stay float (shared precision policy).
2. ``calibrators.collect`` on the float model: per-channel activation statistics (and rows for AWQ).
3. int8: SmoothQuant scales; int4-wo: AWQ search (or none for rtn); fp8: no migration.
4. Activation ranges (int8, fp8) of the migrated activations: the max calibrator reads them from step 2's
   statistics (max|x_j / s_j| is exact); percentile and entropy run onnxruntime's calibrators on the migrated model.
5. ``qdq.rewrite`` then the exact fold pipeline (Q/DQ are not Casts: no fold rule matches them).

Memory: on a lazily loaded model (``data_dir``) the weights are never all in this process. Calibration runs the
model by path; each projection's weight is read from its file when a step needs it and dropped after
(``stored``): its group's migration scales, then its written form, quantized at once; the weights left float stay
references into the source's data file, which the save copies file to file.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import ModelProto, helper, numpy_helper

from ..core.errors import InputError
from ..core.graph import Namer
from ..passes import fold
from ..precision.opset import at_opset
from . import awq, calibrators, gemm, smoothquant, stored
from .calib_data import CalibSet
from .config import METADATA_KEY, MIN_BLOCK, MIN_IR, MIN_OPSET, QuantConfig
from .qdq import EdgePlan, rewrite
from .report import NodeReport, QuantReport
from .targets import Excluded, Selection, Target, select, source_labels


@dataclass(frozen=True)
class QuantResult:
    model: ModelProto
    report: QuantReport


def _check_source(model: ModelProto) -> None:
    ops = {n.op_type for n in model.graph.node}
    if ops & {"QuantizeLinear", "DequantizeLinear", "QLinearMatMul", "MatMulInteger"}:
        raise InputError("the model is already quantized (it has Q/DQ or integer MatMul nodes); quantize the float "
                         "source model instead")


Migration = tuple[dict[str, np.ndarray], dict[str, str], dict[str, calibrators.ActStats]]


def _migrations(model: ModelProto, cfg: QuantConfig, groups: dict[str, list[Target]], read: stored.WeightReader,
                blocks: dict[str, int], calib: CalibSet, data_dir: Path | None) -> Migration:
    """Per activation: s (weights rows * s, x / s), a description, and the float model's statistics. The weights
    are read one group (the projections of one activation) at a time."""
    keep_rows = cfg.mode == "int4-wo" and cfg.int4_method == "awq"
    stats = calibrators.collect(model, list(groups), calib.samples, keep_rows, cfg.seed, data_dir)
    scales: dict[str, np.ndarray] = {}
    notes: dict[str, str] = {}
    for x, ts in groups.items():
        if cfg.mode != "int8" and not keep_rows:  # fp8, int4 rtn: no migration
            notes[x] = "none"
            continue
        ws = [read(t.weight) for t in ts]
        if cfg.mode == "int8":
            scales[x] = smoothquant.smooth_scales(stats[x], ws, cfg.alpha)
            notes[x] = f"smoothquant alpha={cfg.alpha}"
        else:
            choice = awq.search(stats[x], ws, blocks[x])
            if choice.alpha > 0:
                scales[x] = choice.scales
            # the error of the written weights (after the clipping search) is filled in by ``stored.written``
            notes[x] = (f"awq alpha={choice.alpha:.2f} (calibration rel. error {{error:.3g}}, "
                        f"rtn {choice.error_rtn:.3g})")
        del ws
    return scales, notes, stats


def quantize(model: ModelProto, cfg: QuantConfig, calib: CalibSet, data_dir: Path | None = None) -> QuantResult:
    """``data_dir``: the folder of the source model when it was loaded lazily (``onnx_io.load(..., lazy=True)``):
    weights still on disk are read from their file one at a time, calibration runs the model by path (onnxruntime
    reads the weights itself), and the result's untouched weights stay on disk (save it with
    ``save_model(..., source_dir=data_dir)``)."""
    start = time.perf_counter()
    _check_source(model)
    with source_labels(model):  # the report's and --exclude's labels are the source's (module targets)
        model = _at_opset(model, cfg.mode)
        model = fold(model).model  # exporters' Identity/Cast on weights hide projections (a tied LM head) from select
    model = _lift_weight_constants(model)
    model, sel = _select(model, cfg, data_dir)
    if not sel.targets:
        reasons = "; ".join(f"{e.name}: {e.reason}" for e in sel.excluded[:3]) or "no MatMul with a float32 weight"
        raise InputError(f"nothing to quantize ({reasons}); check --exclude and the model")
    groups: dict[str, list[Target]] = defaultdict(list)
    for t in sel.targets:
        groups[t.x].append(t)
    read = stored.reader(model, data_dir)
    stored.check_finite(sel.targets, read)
    blocks = {x: block_for(ts[0].in_features, cfg.block_size) for x, ts in groups.items()}
    scales, notes, stats = _migrations(model, cfg, groups, read, blocks, calib, data_dir)
    amax = _act_ranges(model, cfg, groups, scales, stats, calib, read, data_dir)
    edges = {x: EdgePlan(x, tuple(t.index for t in ts), (1.0 / scales[x]).astype(np.float32) if x in scales
                         else None, amax.get(x)) for x, ts in groups.items()}
    weights, errors = stored.written(sel.targets, read, scales, stats, blocks, cfg)
    notes = {x: note.format(error=errors[x]) if x in errors else note for x, note in notes.items()}
    quantized = rewrite(model, cfg.mode, edges, weights)
    del weights  # the rewrite holds the stored values now (as initializers)
    folded = fold(quantized, inplace=True)  # a new model: folded without a copy
    report = QuantReport(
        mode=cfg.mode, calibration=calib.source,
        calibrator=None if cfg.mode == "int4-wo" else cfg.calibrator,
        alpha=cfg.alpha if cfg.mode == "int8" else None,
        block_size=cfg.block_size if cfg.mode == "int4-wo" else None,
        int4_method=cfg.int4_method if cfg.mode == "int4-wo" else None,
        nodes=tuple(NodeReport(t.name, t.weight, (t.in_features, t.out_features), t.x, amax.get(t.x), notes[t.x],
                               blocks[t.x] if cfg.mode == "int4-wo" else None) for t in sel.targets),
        excluded=sel.excluded, opset=max(i.version for i in folded.model.opset_import if i.domain in ("", "ai.onnx")),
        seconds=round(time.perf_counter() - start, 3), fold=folded.report)
    out = folded.model
    helper.set_model_props(out, {**{p.key: p.value for p in out.metadata_props}, METADATA_KEY: report.metadata()})
    return QuantResult(out, report)


def _at_opset(model: ModelProto, mode: str) -> ModelProto:
    """``model`` converted (``onnx.version_converter``) to the default-domain opset the mode's Q/DQ needs, when it is
    older: only declaring the newer opset would leave ops whose signature changed invalid (ReduceMean's ``axes``
    became an input at 18, Unsqueeze's at 13: an opset-17 RMSNorm failed onnx.checker after fp8/int4). The converter
    runs on the weightless skeleton (it serialises its input: weights would hit protobuf's 2 GiB limit) and the
    weights go back unchanged; the IR version stays the source's, or the mode's minimum (the converter writes its
    newest); model-local functions (which the converter drops) and metadata are the source's."""
    return at_opset(model, MIN_OPSET[mode], MIN_IR[mode], f"--mode {mode}")


def _lift_weight_constants(model: ModelProto) -> ModelProto:
    """A copy with each top-level ``Constant`` node (a ``value`` tensor) that is a MatMul's or Gemm's input B turned
    into the initializer of the same name (exporters without constant folding write weights so; ``select`` and
    ``gemm`` see initializers only). The same tensor under the same name: every reader computes the same."""
    weights = {n.input[1] for n in model.graph.node
               if n.op_type in ("MatMul", "Gemm") and n.domain in ("", "ai.onnx") and len(n.input) > 1}
    lift = {n.output[0]: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant"
            and n.domain in ("", "ai.onnx") and n.output[0] in weights and [a.name for a in n.attribute] == ["value"]}
    if not lift:
        return model
    out = ModelProto()
    out.CopyFrom(model)
    keep = [n for n in out.graph.node if n.op_type != "Constant" or n.output[0] not in lift]
    for name, value in lift.items():
        tensor = out.graph.initializer.add()
        tensor.CopyFrom(value)
        tensor.name = name
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


def _select(model: ModelProto, cfg: QuantConfig, data_dir: Path | None) -> tuple[ModelProto, Selection]:
    """The model with the Gemms to quantize lowered to MatMul (+ Add), the MatMuls to quantize that read
    ``Transpose(W)`` of an initializer reading ``W^T`` (``gemm.untranspose``), and its selection. Every Gemm that can
    be lowered is, on trial (and every such MatMul rewritten); those the selection then leaves float are kept as
    they were (``gemm``: a lowered pair is not bit-identical to the Gemm) and listed as excluded with the
    selection's reason, as is every Gemm that cannot be."""
    found, flipped = gemm.candidates(model), gemm.transposed_weights(model)
    if not found and not flipped:
        return model, _chosen(select(model, cfg.exclude, cfg.quantize_lm_head, cfg.mode == "int4-wo"), cfg)
    lowerable = {label for label, why in found.items() if why is None}
    trial = _chosen(select(gemm.untranspose(gemm.lower(model, lowerable, data_dir), flipped, trial=True),
                           cfg.exclude, cfg.quantize_lm_head, cfg.mode == "int4-wo"), cfg)
    chosen = {t.name for t in trial.targets}
    wanted, unflip = chosen & lowerable, chosen & flipped
    reasons = {label: why for label, why in found.items() if why is not None}
    # a Gemm or Transpose-weight MatMul left as it is: the trial's reason (LM head, --exclude, policy)
    reasons.update({e.name: e.reason for e in trial.excluded if e.name in (lowerable - wanted) | (flipped - unflip)})
    final = gemm.untranspose(gemm.lower(model, wanted, data_dir), unflip, data_dir)
    sel = _chosen(select(final, cfg.exclude, cfg.quantize_lm_head, cfg.mode == "int4-wo"), cfg)
    kept = tuple(e for e in sel.excluded if e.name not in reasons)
    return final, Selection(sel.targets, kept + tuple(Excluded(k, v) for k, v in reasons.items()))


def block_for(in_features: int, wanted: int) -> int:
    """The largest power of two <= ``wanted`` that divides ``in_features`` (TensorRT builds whole blocks only: "The
    quantization axis must divide into whole blocks"); 0 when it would be below ``MIN_BLOCK``."""
    b = wanted
    while b >= MIN_BLOCK and in_features % b:
        b //= 2
    return b if b >= MIN_BLOCK else 0


def _chosen(sel: Selection, cfg: QuantConfig) -> Selection:
    """``sel`` less the projections the mode cannot quantize (int4: no whole block), decided on ``_select``'s trial
    too, so a Gemm or Transpose-weight MatMul left float for that is left as it was (it was lowered all the same)."""
    return _whole_blocks(sel, cfg.block_size) if cfg.mode == "int4-wo" else sel


def _whole_blocks(sel: Selection, wanted: int) -> Selection:
    keep = tuple(t for t in sel.targets if block_for(t.in_features, wanted))
    dropped = tuple(Excluded(t.name, f"in_features {t.in_features} has no power-of-two block >= {MIN_BLOCK} and "
                                     f"<= {wanted} dividing it (TensorRT builds whole int4 blocks only)")
                    for t in sel.targets if t not in keep)
    return Selection(keep, sel.excluded + dropped)


def _act_ranges(model: ModelProto, cfg: QuantConfig, groups: dict[str, list[Target]], scales: dict[str, np.ndarray],
                stats: dict[str, calibrators.ActStats], calib: CalibSet, read: stored.WeightReader,
                data_dir: Path | None) -> dict[str, float]:
    if cfg.mode == "int4-wo":
        return {}
    if cfg.calibrator == "max":
        found = {x: smoothquant.smoothed_amax(stats[x], scales.get(x, np.ones_like(stats[x].amax))) for x in groups}
        return _finite_ranges(found)
    # Percentile / entropy: onnxruntime's calibrators on the migrated, still float model (x / s and s * W, so every
    # later activation is the float model's).
    # A lazily loaded model's s * W go to a temporary file one at a time (``stored.spill``), never all in memory.
    with contextlib.ExitStack() as stack:
        put = stack.enter_context(stored.spill()) if data_dir is not None else numpy_helper.from_array
        migrated = model
        if scales:
            migrated = ModelProto()
            migrated.CopyFrom(model)
            # each projection gets its own s * W: one weight read from two activations has two scales (scaling the
            # shared initializer in place gave one of them the other's, so every later range came from a wrong model)
            fresh = Namer(migrated)
            for x, s in scales.items():
                for t in groups[x]:
                    name = fresh(f"{t.weight}_migrated")
                    migrated.graph.initializer.append(put(read(t.weight) * s[:, None], name))
                    migrated.graph.node[t.index].input[1] = name
            edges = {x: EdgePlan(x, tuple(t.index for t in groups[x]), (1.0 / s).astype(np.float32), None)
                     for x, s in scales.items()}
            migrated = rewrite(migrated, cfg.mode, edges, [])
        names = {x: _migrated_name(migrated, x) for x in groups}
        found = calibrators.ranges(migrated, list(names.values()), calib.samples, cfg.calibrator, data_dir)
    return _finite_ranges({x: found[names[x]] for x in groups})


def _finite_ranges(amax: dict[str, float]) -> dict[str, float]:
    """Refuse an activation whose calibrated range is NaN / inf (float32 overflow inside the model on the
    calibration samples): its scale would be too."""
    for x, a in amax.items():
        if not np.isfinite(a):
            raise InputError(f"calibration: activation {x!r} reaches {a} on the calibration samples (float32 "
                             "overflow); check the calibration data and the model's weights")
    return amax


def _migrated_name(model: ModelProto, x: str) -> str:
    from ..core.onnx_io import MIGRATION_DOC

    for node in model.graph.node:
        if node.doc_string == MIGRATION_DOC and node.input[0] == x:
            return node.output[0]
    return x
