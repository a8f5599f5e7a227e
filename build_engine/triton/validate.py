"""Validate a Triton ``config.pbtxt`` for a trtforge engine.

Two layers, both reporting ``Problem(line, reason)``:

1. Parsing with the ``ModelConfig`` protobuf that ``tritonclient`` ships (``google.protobuf.text_format.Parse``):
   unknown fields, bad enum values and syntax errors are rejected with protobuf's own line number.
2. Rules parsing cannot see: platform, ``max_batch_size`` against the engine's batch range, preferred batch sizes
   within ``1..max_batch_size``, dynamic batching only when batching, data types TensorRT can bind and equal to the
   manifest's, tensor names equal to the manifest's, ``dims`` equal to the manifest's shapes (minus the batch
   dimension when ``max_batch_size > 0``), GPU instance groups whose ``profile`` indices exist in the engine,
   ``model_warmup`` samples whose inputs match the config's (names, data types, concrete dims inside an optimization
   profile) with a batch Triton accepts (their files are checked by ``warmup.check_files``).

Line numbers for rule problems are found by locating the offending field in the text (protobuf's Python text
parser keeps no positions); when a field cannot be located the line is 0 and the message still names the field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..engine.manifest import Manifest
from .config import DTYPE_TO_TRITON, engine_max_batch

# TensorRT cannot bind these (strings) or they are not data types at all.
_UNBINDABLE = {"TYPE_INVALID", "TYPE_STRING"}


@dataclass(frozen=True)
class Problem:
    """One validation failure: 1-based line in config.pbtxt (0 = not located) and a one-line reason."""

    line: int
    reason: str

    def format(self, source: str) -> str:
        return f"{source}:{self.line}: {self.reason}" if self.line else f"{source}: {self.reason}"


_MAX_REASON = 300  # characters of a parse error kept in the one line that reports it


def parse_config(text: str) -> tuple[Any, list[Problem]]:
    """Parse with tritonclient's ModelConfig; unknown fields are rejected. Returns (proto or None, problems)."""
    from google.protobuf import text_format  # lazy
    from tritonclient.grpc import model_config_pb2 as pb

    proto = pb.ModelConfig()
    try:
        text_format.Parse(text, proto)
    except text_format.ParseError as exc:
        line = exc.GetLine() or 0
        msg = str(exc)
        msg = " ".join(re.sub(r"^\d+:\d+ : ", "", msg).split())
        if len(msg) > _MAX_REASON:  # protobuf quotes the whole offending token: a 100 kB line was echoed in full
            msg = msg[:_MAX_REASON - 25] + f"... ({len(msg):,} characters)"
        return None, [Problem(line, msg)]
    return proto, []


def _line_of(text: str, pattern: str, after: int = 0) -> int:
    """1-based line of the first regex match at or after character offset ``after`` (0 if none)."""
    m = re.compile(pattern, re.M).search(text, after)
    return text.count("\n", 0, m.start()) + 1 if m else 0


def _offset_of_line(text: str, line: int) -> int:
    if line <= 1:
        return 0
    idx = -1
    for _ in range(line - 1):
        idx = text.find("\n", idx + 1)
        if idx < 0:
            return len(text)
    return idx + 1


def _tensor_line(text: str, kind: str, name: str) -> int:
    """Line of ``name: "<name>"`` inside the first ``input``/``output`` section that holds it."""
    from google.protobuf import text_encoding  # lazy

    start = _line_of(text, rf"^\s*{kind}\b")
    # as written (a name with '"' or '\\' is escaped in the file: protobuf's text format, as_utf8) or as typed
    quoted = "|".join(dict.fromkeys(re.escape(n) for n in (text_encoding.CEscape(name, as_utf8=True), name)))
    quoted = f"(?:{quoted})"
    line = _line_of(text, rf"\bname\s*:\s*[\"']{quoted}[\"']", _offset_of_line(text, start))
    return line or start


def _platform_rules(proto: Any, text: str) -> list[Problem]:
    # tritonserver refuses any other pair ("unexpected 'platform' and 'backend' pair"), e.g. tensorrt_plan with
    # backend "onnxruntime".
    ok = proto.platform in ("tensorrt_plan", "") and proto.backend in ("tensorrt", "") and (
        proto.platform or proto.backend)
    if ok:
        return []
    return [Problem(_line_of(text, r"^\s*(platform|backend)\b"),
                    f"platform {proto.platform!r} / backend {proto.backend!r}: a TensorRT engine needs "
                    "platform: \"tensorrt_plan\" (and no backend, or backend: \"tensorrt\")")]


def _batch_rules(proto: Any, text: str, manifest: Manifest | None) -> list[Problem]:
    out: list[Problem] = []
    mbs = proto.max_batch_size
    mbs_line = _line_of(text, r"\bmax_batch_size\b")
    if mbs < 0:
        out.append(Problem(mbs_line, f"max_batch_size {mbs} is negative; use 0 (no batching) or a positive size"))
    if manifest is not None and mbs > 0:
        emax = engine_max_batch(manifest)
        if emax == 0:
            out.append(Problem(mbs_line, f"max_batch_size {mbs} but the engine's first dimension is not a dynamic "
                                         "batch dimension shared by every input, admitting batch 1; use "
                                         "max_batch_size: 0 and full dims"))
        elif mbs > emax:
            out.append(Problem(mbs_line, f"max_batch_size {mbs} exceeds the engine's largest batch {emax} (its "
                                         "optimization profiles); lower it or rebuild the engine"))
    if proto.HasField("dynamic_batching"):
        db = proto.dynamic_batching
        db_line = _line_of(text, r"\bdynamic_batching\b")
        if mbs <= 0:
            out.append(Problem(db_line, "dynamic_batching needs max_batch_size > 0; remove it or set max_batch_size"))
        out += _priority_rules(db, text, db_line)
        for size in db.preferred_batch_size:
            if size < 1 or (mbs > 0 and size > mbs):
                line = _line_of(text, rf"\bpreferred_batch_size\s*:\s*\[?[^\]\n]*(?<![\d-]){size}(?!\d)",
                                _offset_of_line(text, db_line))
                out.append(Problem(line or db_line, f"preferred_batch_size {size} is outside 1..max_batch_size "
                                                    f"({mbs}); Triton rejects it"))
    return out


def _priority_rules(db: Any, text: str, db_line: int) -> list[Problem]:
    """tritonserver: with ``priority_levels`` set, the default level and every ``priority_queue_policy`` key must lie
    in 1..priority_levels ("default priority level must be in range [1, N]")."""
    levels = db.priority_levels
    if not levels:
        return []
    line = _line_of(text, r"\bpriority_levels\b", _offset_of_line(text, db_line)) or db_line
    out = []
    if not 1 <= db.default_priority_level <= levels:
        out.append(Problem(line, f"dynamic_batching default_priority_level {db.default_priority_level} is outside "
                                 f"1..priority_levels ({levels}); tritonserver refuses it"))
    out += [Problem(line, f"dynamic_batching priority_queue_policy level {k} is outside 1..priority_levels "
                          f"({levels}); tritonserver refuses it") for k in sorted(db.priority_queue_policy)
            if not 1 <= k <= levels]
    return out


def _tensor_rules(proto: Any, text: str, manifest: Manifest | None) -> list[Problem]:
    from tritonclient.grpc import model_config_pb2 as pb  # lazy

    out: list[Problem] = []
    skip = 1 if proto.max_batch_size > 0 else 0
    for kind, items, mkey in (("input", proto.input, "inputs"), ("output", proto.output, "outputs")):
        seen: set[str] = set()
        expected = {t.name: t for t in getattr(manifest, mkey)} if manifest is not None else {}
        for t in items:
            line = _tensor_line(text, kind, t.name)
            dtype = pb.DataType.Name(t.data_type)
            if t.name in seen:
                out.append(Problem(line, f"{kind} {t.name!r} is listed twice"))
            seen.add(t.name)
            if dtype in _UNBINDABLE:
                at = _line_of(text, r"\bdata_type\b", _offset_of_line(text, line)) or line
                out.append(Problem(at, f"{kind} {t.name!r}: data_type {dtype} cannot be bound to a TensorRT engine; "
                                       "use the manifest's type"))
            if kind == "input" and t.is_shape_tensor:  # tritonserver: "incorrectly specified as a shape tensor"
                at = _line_of(text, r"\bis_shape_tensor\b", _offset_of_line(text, line)) or line
                out.append(Problem(at, f"input {t.name!r}: is_shape_tensor is true, but trtforge engines take no "
                                       "shape tensors (build refuses them) and tritonserver refuses the model; "
                                       "remove is_shape_tensor"))
            shape_problem = _shape_problem(t, batching=skip == 1)
            if shape_problem:
                out.append(Problem(line, f"{kind} {t.name!r}: {shape_problem}"))
            if manifest is None:
                continue
            m = expected.get(t.name)
            if m is None:
                out.append(Problem(line, f"{kind} {t.name!r} is not an {kind} of the engine (manifest has "
                                         f"{sorted(expected)}); use the engine's tensor names"))
                continue
            want_type = DTYPE_TO_TRITON.get(m.dtype, "no Triton type")
            if dtype != want_type:
                tl = _line_of(text, r"\bdata_type\b", _offset_of_line(text, line)) or line
                out.append(Problem(tl, f"{kind} {t.name!r}: data_type {dtype} but the engine's tensor is "
                                         f"{m.dtype} ({want_type})"))
            want_dims = list(m.shape[skip:])
            if skip and (not m.shape or m.shape[0] != -1):
                out.append(Problem(line, f"{kind} {t.name!r}: max_batch_size > 0 but the engine's first dimension "
                                         f"is {list(m.shape[:1])}, not a dynamic batch dimension"))
            elif _engine_dims(t) != want_dims:
                what = "without the batch dimension" if skip else "(max_batch_size 0: full shape)"
                dl = _line_of(text, r"\bdims\b", _offset_of_line(text, line)) or line
                field = "reshape" if t.HasField("reshape") else "dims"
                out.append(Problem(dl, f"{kind} {t.name!r}: {field} {_engine_dims(t)} do not match the engine's "
                                       f"{want_dims} {what}"))
        if manifest is not None:
            missing = [n for n in expected if n not in seen]
            if missing:
                why = ("Triton must bind every input" if kind == "input" else
                       "a client cannot ask for an output the config does not list")
                out.append(Problem(_line_of(text, rf"^\s*{kind}\b"),
                                   f"engine {kind}(s) {missing} missing from the config; {why}"))
    return out


def _engine_dims(t: Any) -> list[int]:
    """The engine's shape (without the batch dimension) that a config tensor stands for: its ``reshape`` if set."""
    return list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)


def _shape_problem(t: Any, batching: bool) -> str:
    """What tritonserver refuses in a tensor's ``dims``/``reshape``/``format``: no dims at all (a batch-only tensor
    needs ``dims: [1]`` with ``reshape: { shape: [] }``), that empty reshape without batching (a scalar: Triton has
    none), sizes other than -1 or >= 1, a reshape of another size (``_reshape_fits``), an image format without 3
    dims."""
    if not t.dims:
        return ("no dims; Triton requires them (a tensor that is only the batch dimension takes dims: [ 1 ] with "
                "reshape: { shape: [ ] })")
    if t.HasField("reshape") and not t.reshape.shape and not batching:
        return "empty reshape with max_batch_size 0 (a scalar); Triton serves no scalar tensors"
    if any(d < -1 or d == 0 for d in [*t.dims, *t.reshape.shape]):  # tritonserver: "must be integer >= 1, or -1"
        return f"dims {list(t.dims)} / reshape {list(t.reshape.shape)} may only hold -1 or sizes >= 1"
    if t.HasField("reshape") and not _reshape_fits(list(t.dims), list(t.reshape.shape)):
        return f"dims {list(t.dims)} and reshape {list(t.reshape.shape)} hold different numbers of elements"
    fmt = t.format if "format" in t.DESCRIPTOR.fields_by_name else 0  # inputs only
    if fmt and len(t.dims) != 3:  # FORMAT_NHWC / FORMAT_NCHW
        return f"an image format needs exactly 3 dims, not {list(t.dims)} (tritonserver: 'NHWC/NCHW require 3 dims')"
    return ""


def _reshape_fits(dims: list[int], shape: list[int]) -> bool:
    """tritonserver's rule: equal element counts (an empty reshape: dims of one element), and with -1 dims the same
    number of them and equal products between them (``[2, 4, -1, 6]`` fits ``[8, -1, 1, 6]``)."""
    def count(d: list[int]) -> int:  # as Triton's GetElementCount: -1 if variable, 0 for no dims
        return -1 if -1 in d else (math.prod(d) if d else 0)

    def trunks(d: list[int]) -> list[int]:
        out, cur = [], 1
        for x in d:
            if x == -1:
                out.append(cur)
                cur = 1
            else:
                cur *= x
        return [*out, cur]

    n, m = count(dims), count(shape)
    if n != m:
        return m == 0 and n == 1
    return n != -1 or trunks(dims) == trunks(shape)


def _instance_rules(proto: Any, text: str, manifest: Manifest | None) -> list[Problem]:
    from tritonclient.grpc import model_config_pb2 as pb  # lazy

    out: list[Problem] = []
    n_prof = manifest.optimization_profiles if manifest is not None else None
    start = _offset_of_line(text, _line_of(text, r"^\s*instance_group\b"))
    for g in proto.instance_group:
        kind = pb.ModelInstanceGroup.Kind.Name(g.kind)
        gline = _line_of(text, r"\bkind\s*:", start) or _line_of(text, r"^\s*instance_group\b")
        if kind not in ("KIND_GPU", "KIND_AUTO"):
            out.append(Problem(gline, f"instance_group kind {kind}: a TensorRT engine runs only on GPU; use KIND_GPU"))
        if g.count < 0:
            out.append(Problem(gline, f"instance_group count {g.count} is negative"))
        for p in g.profile:
            valid = p.isdigit() and (n_prof is None or int(p) < n_prof)
            if not valid:
                pline = _line_of(text, rf"\bprofile\s*:[^\n]*[\"']{re.escape(p)}[\"']", start) or gline
                have = f"0..{n_prof - 1}" if n_prof else "non-negative integers"
                out.append(Problem(pline, f"instance_group profile {p!r} does not exist; the engine's optimization "
                                          f"profiles are {have}"))
        start = _offset_of_line(text, gline + 1)
    return out


def _warmup_input_problem(name: str, t: Any, cfg_in: Any, manifest: Manifest | None, batching: bool) -> str | None:
    from tritonclient.grpc import model_config_pb2 as pb  # lazy

    if cfg_in is None:
        return f"input {name!r} is not an input of the config"
    if t.data_type != cfg_in.data_type:
        return (f"input {name!r}: data_type {pb.DataType.Name(t.data_type)} but the input is "
                f"{pb.DataType.Name(cfg_in.data_type)}")
    dims, want = list(t.dims), list(cfg_in.dims)
    if len(dims) != len(want) or any(d < 1 or (w != -1 and d != w) for d, w in zip(dims, want, strict=False)):
        return f"input {name!r}: dims {dims} do not fit the input's dims {want} (concrete sizes >= 1)"
    m = next((x for x in manifest.inputs if x.name == name), None) if manifest is not None else None
    full = ([1] if batching else []) + (list(cfg_in.reshape.shape) if cfg_in.HasField("reshape") else dims)
    if m is not None and m.profiles and not any(
            all(lo <= d <= hi for d, lo, hi in zip(full, p.min, p.max, strict=False)) for p in m.profiles):
        return f"input {name!r}: shape {full} is outside every optimization profile of the engine"
    return None


def _warmup_rules(proto: Any, text: str, manifest: Manifest | None) -> list[Problem]:
    """Each ``model_warmup`` sample: a batch Triton accepts; every input of the config, no other, with its data
    type and concrete dims inside the config's dims and inside an optimization profile of the engine."""
    out: list[Problem] = []
    mbs = proto.max_batch_size
    cfg_inputs = {t.name: t for t in proto.input}
    start = _offset_of_line(text, _line_of(text, r"^\s*model_warmup\b"))
    for w in proto.model_warmup:
        line = _line_of(text, rf"\bname\s*:\s*[\"']{re.escape(w.name)}[\"']", start) or _line_of(
            text, r"^\s*model_warmup\b")
        where = f"model_warmup {w.name!r}"
        if w.batch_size < 1 or (mbs > 0 and w.batch_size > mbs) or (mbs <= 0 and w.batch_size != 1):
            out.append(Problem(line, f"{where}: batch_size {w.batch_size} must be 1..max_batch_size ({mbs}), or 1 "
                                     "without batching"))
        missing = sorted(set(cfg_inputs) - set(w.inputs))
        if missing:
            out.append(Problem(line, f"{where}: input(s) {missing} missing; a warm-up request needs every input"))
        for name, t in sorted(w.inputs.items()):
            problem = _warmup_input_problem(name, t, cfg_inputs.get(name), manifest, mbs > 0)
            if problem is not None:
                out.append(Problem(line, f"{where}: {problem}"))
    return out


def is_other_backend(proto: Any) -> bool:
    """A config for another backend than TensorRT (an ensemble, a Python pre/post-processing model)."""
    return proto.platform not in ("tensorrt_plan", "") or proto.backend not in ("tensorrt", "")


def validate_text(text: str, manifest: Manifest | None = None, expected_name: str | None = None,
                  other_backends: bool = False) -> tuple[Any, list[Problem]]:
    """Parse and check a config; ``manifest`` enables the engine-consistency rules. Returns (proto, problems).
    ``other_backends``: a config for another backend (``is_other_backend``) is only parsed and its name checked (a
    repository beside the engines; tritonserver judges the rest by that backend's rules)."""
    proto, problems = parse_config(text)
    if proto is None:
        return None, problems
    if expected_name is not None and proto.name and proto.name != expected_name:
        problems.append(Problem(_line_of(text, r"^\s*name\b"), f"name {proto.name!r} differs from the model folder "
                                                               f"{expected_name!r}; Triton requires them equal"))
    if other_backends and is_other_backend(proto):
        return proto, problems
    problems += _platform_rules(proto, text)
    problems += _batch_rules(proto, text, manifest)
    problems += _tensor_rules(proto, text, manifest)
    problems += _instance_rules(proto, text, manifest)
    problems += _warmup_rules(proto, text, manifest)
    return proto, sorted(problems, key=lambda p: p.line)
