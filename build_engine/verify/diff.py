"""Compare two models' outputs through Polygraphy: ``Comparator.run`` over two onnxruntime runners on the same
seeded random inputs, then ``Comparator.compare_accuracy`` with ``CompareFunc.simple``.

Tolerances (Polygraphy's element-wise rule: an element mismatches only if ``|a-b| > atol`` AND ``|a-b|/|b| > rtol``;
NaN always mismatches, even against NaN, under the quantized presets below too, so an output holding NaN fails them
however well its whole-output numbers agree; integer and bool outputs (token ids) are judged by the same rule, so
ids 5000 vs 5001 pass fp16 (``|a-b|/|b|`` is 2e-4); the bitwise mode below, judged on bytes alone, compares them
exactly):

=========  ======  ======  ======================================================================
precision  atol    rtol    why
=========  ======  ======  ======================================================================
fp32       1e-5    1e-5    reassociation noise of fp32 accumulations; anything above is a real change
fp16       1e-2    1e-3    fp16 epsilon is 9.8e-4; a few roundings along a layer stack stay below 1e-2
bf16       5e-2    1e-2    bf16 epsilon is 7.8e-3 (8 mantissa bits)
=========  ======  ======  ======================================================================

Quantized models (``--precision int8|int4-wo|fp8``, B the fp32 source) are judged on the whole output, not element by
element (one flipped rounding moves single logits by more than any useful atol): relative error
``||A - B|| / ||B||`` (an element where both hold the same infinity, a -inf mask, or both NaN counts in neither
norm; a NaN against a number makes it inf) and,
for every float output whose last axis is longer than 1 (logits, but also KV-cache or hidden-state outputs), top-1
agreement (the share of positions whose argmax over the last axis is the same); for a
bool or integer output (token ids from an ArgMax head) the relative error is the share of elements that differ:

=========  ==============  ===============  ================================================================
precision  max rel. error  min top-1 agr.   why
=========  ==============  ===============  ================================================================
int8       0.10            0.85             W8A8 SmoothQuant: ~0.5% per-element noise, grows along the stack
fp8        0.15            0.80             E4M3 has 3 mantissa bits (relative step 6.25%) on both operands
int4-wo    0.35            0.50             16 levels per weight block; activations stay float
=========  ==============  ===============  ================================================================

Random-weight models have nearly flat logits, so their top-1 is the most fragile case; trained models agree more.
``--atol``/``--rtol`` given with these presets add the element-wise rule on top (one given alone decides: the other
is 0, since the rule needs both exceeded).

``atol=rtol=0`` means bitwise: every output must be byte-identical (so -0.0 vs +0.0 and NaN payloads count too).

Inputs are planned by ``trtforge.build_engine.verify.inputs`` (small sizes for dynamic dims, integer inputs bounded
to valid indices). Models with plugin nodes are decomposed to standard ONNX ops (``trtforge.plugins.lora.decompose``)
into a temporary file first, since onnxruntime cannot run them.

An engine folder (with ``manifest.json``) may be one side where full TensorRT and a GPU exist (Polygraphy's
``TrtRunner``); that path is thin and not exercised in CI (no GPU there).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core import interrupt, steps
from ..core.errors import CheckFailed, InputError, ModelError
from .compare import byte_mismatches, compare_arrays, nan_count
from .inputs import FeedSpec, check_same_input_dims, check_tensor_outputs, graph_inputs, plan_feeds, run_failure_hint
from .polygraphy_env import quiet_polygraphy
from .sessions import make_session

PRESETS: dict[str, tuple[float, float]] = {"fp32": (1e-5, 1e-5), "fp16": (1e-2, 1e-3), "bf16": (5e-2, 1e-2)}
# Quantized presets: (max relative error, min top-1 agreement) over whole outputs (module docstring).
QUANT_PRESETS: dict[str, tuple[float, float]] = {"int8": (0.10, 0.85), "fp8": (0.15, 0.80), "int4-wo": (0.35, 0.50)}
_NO_ELEMENTWISE = 1e30  # atol/rtol of the quantized presets: the element-wise rule fails only on a NaN


@dataclass(frozen=True)
class OutputDiff:
    """Per-output comparison numbers (first iteration)."""

    name: str
    max_abs: float
    max_rel: float
    mismatches: int
    total: int
    passed: bool
    # max |a - b| / max |b|: the error relative to the output's scale (element-wise max_rel explodes near zero).
    rel_to_scale: float = 0.0
    rel_error: float = 0.0        # ||a - b|| / ||b|| over the whole output
    top1: float | None = None     # share of positions whose argmax over the last axis agrees (float outputs)
    nans: int = 0                 # elements NaN in either output (each a mismatch under the element-wise rule)
    shapes: str = ""              # "A [2, 3] vs B [3, 2]" when the two outputs' shapes differ (a mismatch as a whole)


@dataclass
class DiffResult:
    """What ``run_diff`` found; ``run_results``/``accuracy`` are Polygraphy objects (``RunResults``,
    ``AccuracyResults``) kept for saving."""

    a: str
    b: str
    atol: float
    rtol: float
    seed: int
    inputs: tuple[FeedSpec, ...]
    outputs: tuple[OutputDiff, ...]
    decomposed: tuple[str, ...] = ()
    run_results: Any = field(default=None, repr=False)
    accuracy: Any = field(default=None, repr=False)
    precision: str = "fp32"

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def summary(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "precision": self.precision, "atol": self.atol, "rtol": self.rtol,
                "seed": self.seed, "passed": self.passed, "decomposed": list(self.decomposed),
                "inputs": [{"name": i.name, "dtype": i.dtype, "shape": list(i.shape), "range": [i.low, i.high]}
                           for i in self.inputs],
                "outputs": [o.__dict__ for o in self.outputs]}


def tolerances(precision: str, atol: float | None = None, rtol: float | None = None) -> tuple[float, float]:
    if precision not in PRESETS and precision not in QUANT_PRESETS:
        raise InputError(f"--precision {precision!r}: expected one of {', '.join([*PRESETS, *QUANT_PRESETS])}")
    d_atol, d_rtol = PRESETS.get(precision, (_NO_ELEMENTWISE, _NO_ELEMENTWISE))
    if precision in QUANT_PRESETS and (atol is None) != (rtol is None):
        d_atol = d_rtol = 0.0  # --atol alone with 1e30 as rtol could never fail an element
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    if atol < 0 or rtol < 0 or not np.isfinite(atol) or not np.isfinite(rtol):
        raise InputError(f"--atol {atol} / --rtol {rtol}: tolerances must be finite and >= 0")
    return float(atol), float(rtol)


def _io_names(model: Any) -> tuple[list[str], list[str]]:
    return sorted(vi.name for vi in graph_inputs(model)), [o.name for o in model.graph.output]


@contextlib.contextmanager
def _runnable(path: Path, model: Any, workdir: Path, tag: str) -> Iterator[tuple[str, bool]]:
    """Yield a path onnxruntime can run: the model itself, or its plugin-free decomposition in ``workdir``."""
    from trtforge.plugins import has_plugin_nodes

    if not has_plugin_nodes(model):
        yield str(path), False
        return
    from trtforge.plugins.lora.decompose import decompose

    from ..core.onnx_save import save_model, save_with_source_data
    from ..core.onnx_tensors import has_external

    out = workdir / f"{tag}.decomposed.onnx"
    if has_external(model):  # loaded without its weights (``_load``), bodies' too: copied beside the decomposition
        save_with_source_data(decompose(model, inplace=True), path, out)
    else:
        save_model(decompose(model), out)
    yield str(out), True


def _runner(path: str, name: str, optimize: bool) -> Any:
    """An ``OnnxrtRunner`` over the deterministic session of ``sessions.make_session`` (each op as written, no
    weight pre-packing, one thread) unless ``optimize``; an engine folder gets ``engine_runner.engine_runner``."""
    if Path(path).is_dir():
        from .engine_runner import engine_runner

        return engine_runner(Path(path), name)
    from polygraphy.backend.onnxrt import OnnxrtRunner

    return OnnxrtRunner(lambda: make_session(path, optimize=optimize), name=name)


def _load(path: Path) -> Any:
    """The model's graph for planning inputs and decomposing. A model with external data is read without its
    weights (onnxruntime loads them itself, by path): holding them here too would double the memory."""
    from ..core.onnx_io import load_model, load_structure

    if path.is_dir():
        return None
    if path.stat().st_size > _INLINE_SIZE:  # weights inside the file: parse (and check) it once
        return load_model(path)
    loaded = load_structure(path)
    return loaded.model if loaded.external_data else load_model(path)


# A model file this big holds its weights itself (one with external data is its graph only: kilobytes to a few MB).
_INLINE_SIZE = 64 << 20


def _output_diff(name: str, a: np.ndarray, b: np.ndarray, atol: float, rtol: float, poly_pass: bool) -> OutputDiff:
    """trtforge's numbers for one output (``compare.compare_arrays``); it passes when Polygraphy's verdict and the
    element-wise rule agree, or, with ``atol = rtol = 0`` (bitwise), exactly when the arrays are byte-identical
    (then identical NaNs match and ``mismatches`` counts the elements whose bytes differ: Polygraphy's rule, under
    which a NaN never matches, would fail a model compared with itself). Also the whole-output relative error
    ``||a - b|| / ||b||`` and the top-1 agreement over the last axis (quantized presets)."""
    d = compare_arrays(a, b, atol, rtol)
    mismatches, nans = d.mismatches, 0
    if atol == 0 and rtol == 0:
        mismatches = byte_mismatches(a, b)
        passed = mismatches == 0
    else:
        passed, nans = poly_pass and d.mismatches == 0, nan_count(a, b)
    rel_error, top1 = float("inf"), None
    if a.shape == b.shape and a.dtype.kind not in "biu" and b.dtype.kind not in "biu":
        with np.errstate(invalid="ignore", over="ignore"):  # equal infinities differ by 0 (compare.py)
            fa, fb = a.astype(np.float64), b.astype(np.float64)
            same = (fa == fb) | (np.isnan(fa) & np.isnan(fb))  # a NaN both sides share counts in neither norm
            diff = np.where(same, 0.0, np.nan_to_num(fa - fb, nan=np.inf))  # a NaN against a number: error inf
            # ... and leave ||b|| too: one -inf (masked logits) made ||b|| inf, so every such output had error 0
            norm = float(np.linalg.norm(np.where(same & ~np.isfinite(fb), 0.0, fb)))
            err = float(np.linalg.norm(diff))
        rel_error = err / norm if norm > 0 else (0.0 if err == 0 else float("inf"))
        if np.issubdtype(a.dtype, np.floating) and a.ndim >= 1 and a.shape[-1] > 1 and a.size:
            top1 = float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))
    elif a.shape == b.shape:  # bool/integer (token ids): the share of elements that differ, not id arithmetic
        rel_error = float(np.mean(a != b)) if a.size else 0.0
    shapes = "" if a.shape == b.shape else f"A {list(a.shape)} vs B {list(b.shape)}"
    return OutputDiff(name, d.max_abs, d.max_rel, mismatches, d.total, passed and not shapes, d.rel_to_scale,
                      rel_error, top1, nans, shapes)


def _missing(out_a: Any, out_b: Any) -> tuple[OutputDiff, ...]:
    """A failing row for each output only one side produced (an engine's bindings are known only once it runs)."""
    inf = float("inf")
    return tuple(OutputDiff(n, inf, inf, 0, 0, False, inf, inf, shapes=f"only {side} has it")
                 for side, here, there in (("A", out_a, out_b), ("B", out_b, out_a)) for n in here if n not in there)


def judge_quantized(diff: OutputDiff, precision: str) -> OutputDiff:
    """Apply a quantized preset's whole-output criteria (module docstring) on top of the element-wise verdict."""
    from dataclasses import replace

    max_rel, min_top1 = QUANT_PRESETS[precision]
    ok = diff.rel_error <= max_rel and (diff.top1 is None or diff.top1 >= min_top1)
    return replace(diff, passed=diff.passed and ok)


@steps.timed("diff")
def run_diff(a: str | Path, b: str | Path, *, precision: str = "fp32", atol: float | None = None,
             rtol: float | None = None, seed: int = 0, shapes: Mapping[str, tuple[int, ...]] | None = None,
             values: Mapping[str, float] | None = None, extra_inputs: bool = False,
             ort_optimize: bool = False) -> DiffResult:
    """Compare models ``a`` and ``b`` (ONNX files; or engine folders where TensorRT and a GPU exist).

    Both must have the same output names, and the same input names unless ``extra_inputs``: then an input only
    one model has is generated for that model alone (Polygraphy's loader cache drops it from the other runner's
    feed), e.g. a LoRA-injected model against its original with ``values={"lora_slot_ids": -1}``.
    """
    atol, rtol = tolerances(precision, atol, rtol)
    pa, pb = Path(a), Path(b)
    for p in (pa, pb):
        if not p.exists():
            raise InputError(f"{p}: not found; give an ONNX model (or an engine folder)")
    ma, mb = _load(pa), _load(pb)
    for m, p in ((ma, pa), (mb, pb)):
        if m is not None:
            check_tensor_outputs(m, p)
    if ma is None and mb is None:
        raise InputError("diff needs at least one ONNX model to derive inputs from; both sides are engine folders")
    if ma is not None and mb is not None:
        (ia, oa), (ib, ob) = _io_names(ma), _io_names(mb)
        if sorted(oa) != sorted(ob) or (ia != ib and not extra_inputs):
            hint = "" if sorted(oa) != sorted(ob) else " (or pass --extra-inputs to feed inputs only one model has)"
            raise InputError(f"{pa} and {pb} differ in inputs/outputs: {pa.name} has inputs {ia} outputs {oa}, "
                             f"{pb.name} has inputs {ib} outputs {ob}; diff needs the same names{hint}")
        check_same_input_dims(ma, mb, pa, pb)
    else:
        from .engine_runner import check_engine_names

        engine_dir, onnx_path, model = (pa, pb, mb) if ma is None else (pb, pa, ma)
        check_engine_names(engine_dir, onnx_path, _io_names(model), extra_inputs)
    specs = plan_feeds([m for m in (ma, mb) if m is not None], shapes, values)
    name_a, name_b = f"A:{pa.name}", f"B:{pb.name}"
    with tempfile.TemporaryDirectory(prefix="trtforge-diff-") as tmp, contextlib.ExitStack() as stack:
        paths, decomposed = [], []
        for p, m, tag in ((pa, ma, "a"), (pb, mb, "b")):
            if m is None:
                paths.append(str(p))
                continue
            run_path, dec = stack.enter_context(_runnable(p, m, Path(tmp), tag))
            paths.append(run_path)
            if dec:
                decomposed.append(str(p))
        run_results, accuracy = _compare(paths, (name_a, name_b), specs, seed, atol, rtol, ort_optimize)
    out_a, out_b = run_results[name_a][0], run_results[name_b][0]
    verdicts = accuracy[0][(name_a, name_b)][0]
    diffs = tuple(_output_diff(n, np.asarray(out_a[n]), np.asarray(out_b[n]), atol, rtol, bool(verdicts[n]))
                  for n in out_a if n in out_b) + _missing(out_a, out_b)
    if precision in QUANT_PRESETS:
        diffs = tuple(judge_quantized(d, precision) for d in diffs)
    return DiffResult(str(pa), str(pb), atol, rtol, seed, specs, diffs, tuple(decomposed), run_results, accuracy,
                      precision)


def _compare(paths: Sequence[str], names: tuple[str, str], specs: Sequence[FeedSpec], seed: int, atol: float,
             rtol: float, optimize: bool) -> tuple[Any, Any]:
    from polygraphy.common import TensorMetadata
    from polygraphy.comparator import Comparator, DataLoader
    from polygraphy.exception import PolygraphyException

    meta = TensorMetadata()
    for s in specs:
        if s.dtype in ("bfloat16", "object") or s.dtype.startswith(("float8", "float4", "int4", "uint4")):
            # ml_dtypes types: Polygraphy's data loader cannot generate them, onnxruntime's Python API cannot take them
            raise InputError(f"input {s.name!r} is {s.dtype}, which Polygraphy's data loader cannot generate and "
                             "onnxruntime's Python API cannot take; compare variants of the models with float32 or "
                             "float16 inputs (Cast to it inside the model), or check with 'trtforge fold --check'")
        meta.add(s.name, np.dtype(s.dtype), s.shape)
    with quiet_polygraphy():
        loader = DataLoader(seed=seed, iterations=1, input_metadata=meta,
                            val_range={s.name: (s.low, s.high) for s in specs})
        runners = [_runner(p, n, optimize) for p, n in zip(paths, names, strict=True)]
        try:
            results = Comparator.run(runners, data_loader=loader)
        except (PolygraphyException, Exception) as exc:
            text = str(exc)
            raise ModelError(f"running {paths[0]} / {paths[1]} failed: {text}; {run_failure_hint(text)}") from exc
        func = _simple_compare(atol=atol, rtol=rtol, check_error_stat="elemwise", check_shapes=True,
                              infinities_compare_equal=True)
        accuracy = Comparator.compare_accuracy(results, compare_func=func)
    interrupt.check()  # a signal a bare ``except:`` in Polygraphy swallowed (polygraphy_env)
    return results, accuracy


def _simple_compare(**kwargs: Any) -> Any:
    """Polygraphy's simple comparison: ``SimpleCompareFunc`` (0.53+) or ``CompareFunc.simple`` (older, and
    deprecated from 0.53 on)."""
    try:
        from polygraphy.comparator import SimpleCompareFunc
    except ImportError:
        from polygraphy.comparator import CompareFunc

        return CompareFunc.simple(**kwargs)
    return SimpleCompareFunc(**kwargs)


def save_paths(path: str | Path, models: Sequence[str | Path] = ()) -> list[Path]:
    """The files ``save_results(result, path)`` writes, each checked writable (and not one of ``models``) first."""
    from ..core import fsutil
    from ..core import paths as guard

    guard.check(files=[("--save", path)])  # '' or a name-less path ('.', '/') first: it has no stem to add to
    dest = Path(path)
    paths = [dest, dest.with_name(dest.stem + ".accuracy.json"), dest.with_name(dest.stem + ".summary.json")]
    if models:
        guard.check(inputs=[(f"model {'AB'[i] if i < 2 else i}", m) for i, m in enumerate(models)],
                    files=[("--save", p) for p in paths])
    for p in paths:
        fsutil.check_output_file(p)
    return paths


def save_results(result: DiffResult, path: str | Path) -> list[Path]:
    """``path``: Polygraphy ``RunResults`` JSON (``RunResults.load`` / ``polygraphy inspect data`` read it);
    ``<stem>.accuracy.json``: Polygraphy ``AccuracyResults``; ``<stem>.summary.json``: trtforge's per-output table.
    All three are standard JSON: a non-finite number (the infinite relative error of a nonzero value where the
    reference is 0, an inf / NaN maximum) is the string "inf", "-inf" or "nan" (``core.jsonout``), never null."""
    from ..core import fsutil, jsonout
    dest, acc, summ = save_paths(path)
    # The three are written before the first is renamed into place: a full disk leaves none of them.
    # staged_json first: its lock (a concurrent save of the same files waits) is held until the last rename.
    with fsutil.staged_json(summ, {**result.summary(), "run_results": dest.name, "accuracy_results": acc.name}), \
            quiet_polygraphy(), fsutil.atomic_path(dest) as tmp, fsutil.atomic_path(acc) as tmp_acc:
        result.run_results.save(str(tmp))
        result.accuracy.save(str(tmp_acc))
        jsonout.standardize_file(tmp)  # Polygraphy writes bare NaN / Infinity tokens
        jsonout.standardize_file(tmp_acc)
    return [dest, acc, summ]


def check(result: DiffResult) -> None:
    """Raise CheckFailed (exit 1) naming the mismatching outputs."""
    bad = [o for o in result.outputs if not o.passed]
    if bad and result.precision in QUANT_PRESETS:  # judged on the whole output (and --atol/--rtol when given)
        max_rel, min_top1 = QUANT_PRESETS[result.precision]
        whole = [o for o in bad if not (o.rel_error <= max_rel and (o.top1 is None or o.top1 >= min_top1))]
        if not whole:  # only the element-wise rule failed: say so below (the preset's numbers pass)
            beyond = (f"hold NaN (the {result.precision} preset's numbers pass)" if result.atol >= _NO_ELEMENTWISE
                      else f"differ beyond atol={result.atol:g} rtol={result.rtol:g}")
            raise CheckFailed(f"{len(bad)} of {len(result.outputs)} outputs {beyond}: "
                              + ", ".join(_why(o) for o in bad))
        bad = whole
        raise CheckFailed(f"{len(bad)} of {len(result.outputs)} outputs fail the {result.precision} preset (relative "
                          f"error <= {max_rel:g}, top-1 agreement >= {min_top1:g}): " + ", ".join(
                              _why(o) if o.shapes else f"{o.name} (relative error {o.rel_error:.3g}, top-1 "
                              f"{'n/a' if o.top1 is None else f'{o.top1:.3f}'})" for o in bad))
    if bad:
        raise CheckFailed(f"{len(bad)} of {len(result.outputs)} outputs differ beyond atol={result.atol} "
                          f"rtol={result.rtol}: " + ", ".join(_why(o) for o in bad))


def _why(o: OutputDiff) -> str:
    if o.shapes:
        return f"{o.name} ({o.shapes})" if o.shapes.startswith("only") else f"{o.name} (shapes differ: {o.shapes})"
    nan = f", {o.nans} NaN: Polygraphy counts every NaN as a mismatch" if o.nans and o.mismatches else ""
    return f"{o.name} (max abs {o.max_abs:.3g}, {o.mismatches}/{o.total} mismatched{nan})"
