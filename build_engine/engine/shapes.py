"""Map a GPU profile's batch/sequence ranges onto a model's inputs (pure data: no TensorRT here).

Each graph input dimension is one of:

- static (an integer): it must lie inside every optimization profile's range for the axis it sits on (batch or
  sequence), else the model cannot serve the profile and the build is refused (a static sequence length smaller than
  the profile's minimum, a static batch outside the batch range);
- batch or sequence: recognised by its ``dim_param`` name (``batch``, ``batch_size``; ``sequence``, ``seq_len``,
  ...) or, for an unnamed / unrecognised dynamic dimension, by position: dim 0 is batch, dim 1 is sequence for inputs
  of rank >= 2 with an integer dtype (token ids, positions, masks, slot ids);
- a named dynamic dimension given a range with ``build --dim NAME=MIN:OPT:MAX`` (``dims``): that range in every
  optimization profile (the way trtexec's ``--minShapes/--optShapes/--maxShapes`` size a dimension; here by its
  ``dim_param``, so every input that shares it gets it). Batch and sequence names take the profile's ranges, not an
  override; an override naming no dynamic dimension of the model is refused;
- the token count of ``lora_slot_ids`` that ``trtforge lora inject`` names ``lora_tokens`` (a 1-D per-token input
  of a 2-D ``[batch * sequence, H]`` projection input): batch x sequence (min, opt and max multiplied), unless
  ``--dim lora_tokens=...`` gives it (position would have made it a batch: the engine refused more than 16 tokens);
- anything else dynamic is an error naming the input, the dimension and its name.

Dimensions that share a ``dim_param`` get the same values, because TensorRT checks them against each other.

A graph input that is also a graph output (passed straight through) is refused: TensorRT's ONNX parser renames the
input to ``__NAME`` so that the engine would not have the binding the model names (and TensorRT then fails the build
because the renamed input has no shapes in the optimization profiles).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import ModelProto

from trtforge.plugins.lora.spec import TOKENS_DIM
from trtforge.profiles.loader import Profile, Range
from trtforge.profiles.schema import MAX_DIM

from ..core.errors import InputError
from ..core.graph import Dim, dtype_name, tensor_dims


@dataclass(frozen=True)
class ShapeRange:
    """One optimization profile's shapes for one input (a manifest field; defined here, below the manifest)."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def to_json(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


BATCH_NAMES = frozenset({"batch", "batch_size", "batchsize", "b", "n", "num_sequences"})
SEQUENCE_NAMES = frozenset({"sequence", "seq", "seq_len", "seqlen", "sequence_length", "s", "tokens", "num_tokens",
                            "total_sequence_length"})
_INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
              onnx.TensorProto.UINT8, onnx.TensorProto.BOOL}


@dataclass(frozen=True)
class InputSpec:
    name: str
    elem_type: int
    dims: tuple[Dim, ...]

    @property
    def dtype(self) -> str:
        return dtype_name(self.elem_type)


@dataclass(frozen=True)
class InputPlan:
    spec: InputSpec
    axes: tuple[str, ...]          # per dim: "static", "batch", "sequence" or "dim:NAME" (a --dim override)
    ranges: tuple[ShapeRange, ...]  # one per optimization profile

    @property
    def dynamic(self) -> bool:
        return any(a != "static" for a in self.axes)


def model_inputs(model: ModelProto) -> list[InputSpec]:
    """Graph inputs that are not initializers, with their static sizes or dim_params."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        out.append(InputSpec(vi.name, vi.type.tensor_type.elem_type, tensor_dims(vi) or ()))
    return out


def _axis_of(spec: InputSpec, index: int, dim: Dim, source: str, dims: Mapping[str, Range]) -> str:
    if isinstance(dim, str):
        key = dim.strip().lower()
        if key in BATCH_NAMES:
            return "batch"
        if key in SEQUENCE_NAMES:
            return "sequence"
        if dim in dims:
            return f"dim:{dim}"
        if dim == TOKENS_DIM and len(spec.dims) == 1:
            return "tokens"
    if index == 0:
        return "batch"
    if index == 1 and len(spec.dims) >= 2 and spec.elem_type in _INT_TYPES:
        return "sequence"
    what = f"named {dim!r}" if isinstance(dim, str) else "unnamed"
    raise InputError(
        f"{source}: input {spec.name!r} dimension {index} is dynamic ({what}) and is neither batch nor sequence; "
        + (f"give its range with --dim {dim}=MIN:OPT:MAX, name it 'batch' or 'sequence' in the export, or make it "
           "static" if isinstance(dim, str) and dim else
           "name it in the export (then give its range with --dim NAME=MIN:OPT:MAX) or make it static")
    )


def plan_input(spec: InputSpec, profile: Profile, source: str, dims: Mapping[str, Range] | None = None) -> InputPlan:
    """Shape ranges of one input for every optimization profile of ``profile`` (see module docstring)."""
    dims = dims or {}
    axes: list[str] = []
    for i, dim in enumerate(spec.dims):
        if isinstance(dim, int) and dim > 0:
            # A static dim on a batch/sequence position must fit the profile's ranges.
            axis = "static"
            role = _static_role(spec, i, dim)
            if role is not None:
                for sp in profile.shapes:
                    r: Range = getattr(sp, role)
                    if not r.min <= dim <= r.max:
                        raise InputError(
                            f"{source}: input {spec.name!r} has a static {role} of {dim} (dimension {i}), outside "
                            f"profile {profile.name!r} shapes {sp.name!r} {role} range {r.min}..{r.max}; export the "
                            f"model with a dynamic {role} axis or use a profile whose range includes {dim}"
                        )
        else:
            axis = _axis_of(spec, i, dim, source, dims)
        axes.append(axis)
    ranges = []
    for sp in profile.shapes:
        mins: list[int] = []
        opts: list[int] = []
        maxs: list[int] = []
        for dim, axis in zip(spec.dims, axes, strict=True):
            if axis == "static":
                assert isinstance(dim, int)
                lo = mid = hi = dim
            elif axis == "tokens":
                b, q = sp.batch, sp.sequence
                lo, mid, hi = b.min * q.min, b.opt * q.opt, b.max * q.max
            else:
                r = dims[axis[4:]] if axis.startswith("dim:") else getattr(sp, axis)
                lo, mid, hi = r.min, r.opt, r.max
            mins.append(lo)
            opts.append(mid)
            maxs.append(hi)
        ranges.append(ShapeRange(tuple(mins), tuple(opts), tuple(maxs)))
    return InputPlan(spec=spec, axes=tuple(axes), ranges=tuple(ranges))


def _static_role(spec: InputSpec, index: int, dim: int) -> str | None:
    """Which profile axis a static dim stands for: only integer token-like inputs' dims 0/1 are checked."""
    if spec.elem_type not in _INT_TYPES or len(spec.dims) < 2:
        return None
    return {0: "batch", 1: "sequence"}.get(index)


def plan_shapes(model: ModelProto, profile: Profile, source: str = "model",
                dims: Mapping[str, Range] | None = None) -> list[InputPlan]:
    """Shape plans for every graph input; raises InputError when the model cannot take the profile's ranges.
    ``dims``: ranges of named dynamic dimensions other than batch/sequence (``build --dim``)."""
    if not profile.shapes:
        raise InputError(f"profile {profile.name!r} has no [[shapes]]; add at least one optimization profile")
    specs = model_inputs(model)
    if not specs:  # TensorRT builds it, but its manifest (no inputs) is refused by triton, diff and every reader
        raise InputError(f"{source}: the model has no graph inputs (its outputs are constants); an engine serves "
                         "inputs: give the model an input, or use its outputs' values directly")
    _check_passthrough(model, specs, source)
    _check_dim_overrides(specs, dims or {}, source)
    plans = [plan_input(spec, profile, source, dims) for spec in specs]
    # Inputs that share a dim_param must agree on its axis.
    seen: dict[str, tuple[str, str]] = {}
    for plan in plans:
        for dim, axis in zip(plan.spec.dims, plan.axes, strict=True):
            if isinstance(dim, str) and axis != "static":
                prev = seen.setdefault(dim, (axis, plan.spec.name))
                if prev[0] != axis:
                    raise InputError(
                        f"{source}: dimension {dim!r} is {prev[0]} in input {prev[1]!r} but {axis} in input "
                        f"{plan.spec.name!r}; give them distinct names in the export"
                    )
    return plans


def _check_passthrough(model: ModelProto, specs: list[InputSpec], source: str) -> None:
    """Refuse a graph input that is also a graph output (see module docstring)."""
    outputs = {o.name for o in model.graph.output}
    for spec in specs:
        if spec.name in outputs:
            raise InputError(
                f"{source}: input {spec.name!r} is also a graph output (passed straight through); a TensorRT engine "
                "cannot bind one name as both input and output: drop that output, or export it through a node "
                "under another name"
            )


def _check_dim_overrides(specs: list[InputSpec], dims: Mapping[str, Range], source: str) -> None:
    """Each ``--dim`` names a dynamic dimension of the model that is neither batch nor sequence, with a valid range."""
    named = {d for spec in specs for d in spec.dims if isinstance(d, str) and d}
    for name, r in dims.items():
        _check_not_profile_axis("--dim", name)
        if name not in named:
            raise InputError(f"--dim {name}: {source} has no dynamic dimension named {name!r} (its named dynamic "
                             f"dimensions: {sorted(named) or 'none'}); give one of those")
        _check_range("--dim", f"{name}={r.min}:{r.opt}:{r.max}", r, low=0)


def _check_not_profile_axis(what: str, name: str) -> None:
    """Batch and sequence take their ranges from the profile, whatever the model: a ``--dim`` (or a matrix model's
    ``dims``) naming one is refused before any model is read."""
    if name.strip().lower() in BATCH_NAMES | SEQUENCE_NAMES:
        raise InputError(f"{what} {name}: batch and sequence ranges come from the profile's [[shapes]]; give a "
                         "profile (.toml) with the ranges you want instead")


def _check_range(what: str, item: str, r: Range, low: int = 1) -> None:
    """``low``: the least MIN; 0 for a ``--dim`` (a decoder's past length is 0 at its first step, and TensorRT
    builds a profile with a 0 minimum), 1 elsewhere; MAX is at least 1 and at most ``MAX_DIM`` (2**31 - 1, as a
    profile's ranges: TensorRT keeps a profile's dims in 32 bits, so 2**31 failed inside it and 2**32 built an engine
    whose manifest nothing downstream reads)."""
    if not (low <= r.min <= r.opt <= r.max and 1 <= r.max <= MAX_DIM):
        raise InputError(f"{what} {item!r}: need {low} <= MIN <= OPT <= MAX (and MAX >= 1, at most {MAX_DIM}, "
                         "TensorRT's limit)")


def parse_dims(items: Sequence[str], what: str = "--dim") -> dict[str, Range]:
    """``NAME=MIN:OPT:MAX`` items (``build --dim``, a matrix model's ``dims``) as ``Range``s; exit 2 naming the
    malformed one."""
    out: dict[str, Range] = {}
    for item in items:
        name, _, spec = item.rpartition("=")  # a dim_param may hold '=' itself (ONNX allows any string)
        parts = spec.split(":")
        digits = all(x.strip().isascii() and x.strip().isdigit() for x in parts)
        if not name or name in out or len(parts) != 3 or not digits:
            why = "given twice" if name in out else "expected NAME=MIN:OPT:MAX with integers, e.g. num_patches=1:64:256"
            raise InputError(f"{what} {item!r}: {why}")
        _check_not_profile_axis(what, name)
        lo, mid, hi = (int(x) for x in parts)
        out[name] = Range(min=lo, opt=mid, max=hi)
        _check_range(what, item, out[name], low=0)
    return out


def refuse_shape_inputs(network: Any, source: str) -> None:
    """A graph input the parsed network takes as a *shape tensor* (its values, not its shape, size other tensors: the
    shape of a ``Reshape``, the repeats of a ``Tile``) needs value ranges in every optimization profile, which a GPU
    profile cannot give; TensorRT fails the build with "missing values for shape input tensor". Refused first."""
    names = [network.get_input(i).name for i in range(network.num_inputs) if network.get_input(i).is_shape_tensor]
    if names:
        raise InputError(f"{source}: input(s) {', '.join(repr(n) for n in names)} set other tensors' shapes by their "
                         "values (TensorRT shape tensors), which a GPU profile gives no ranges for; compute them in "
                         "the model (e.g. from Shape of another input) or make them constants, then build again")
