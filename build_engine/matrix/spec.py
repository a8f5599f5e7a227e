"""The build-matrix file (TOML): models x GPU profiles, the pipeline per model, and where the results go.

```toml
[matrix]
profiles = ["a10", "a100"]   # built-in names or .toml paths (relative to this file)
backend = "auto"             # auto | tensorrt | tensorrt-rtx
shared_fs = false            # true: workers read models and write engines through paths on a filesystem that every
                             # node shares (large models); false: bytes travel through the executor (Ray's object store)

[[model]]
path = "llama.onnx"          # relative to this file
name = "llama"               # optional, default the file's stem; [A-Za-z0-9_.-]
profiles = ["a100"]          # optional, overrides [matrix].profiles for this model
dims = { patches = "1:16:64" }  # optional: ranges of named dynamic dims other than batch/sequence (build --dim)

[model.pipeline]             # optional, applied in this order before the build (the build itself converts to the
fold = true                  # profile's precision and folds)
precision = "fp16"           # fp16 | bf16: convert before the build (the build then keeps this 16-bit type)
lora = { targets = ["q_proj", "v_proj"], max_rank = 16, slots = 8 }

[triton]                     # optional: assemble a Triton model repository from the built engines
repo = "triton-repo"         # relative to this file; entries are named <model>_<profile>
```

Every field is validated; an error names the file, the line and the fix (exit 2). Paths are resolved against the
matrix file's folder so a matrix runs the same from any working directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trtforge.plugins.lora import spec as lora_spec

from ..core.errors import InputError

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
BACKENDS = ("auto", "tensorrt", "tensorrt-rtx")
PRECISIONS = ("fp16", "bf16")
MAX_CELLS = 10_000
_HEADER_RE = re.compile(r"^\s*\[(\[[^\]]*\]|[^\]]*)\]")  # a table header line: [name], or [[name]] as "[name]"


@dataclass(frozen=True)
class LoraStep:
    targets: tuple[str, ...]
    max_rank: int = 16
    slots: int = 8


@dataclass(frozen=True)
class Pipeline:
    """What happens to a model before ``build_engine`` (fold, precision, LoRA inject, in that order)."""

    fold: bool = True
    precision: str | None = None
    lora: LoraStep | None = None
    #: the model's ``dims`` (``build --dim``): NAME=MIN:OPT:MAX of named dynamic dims other than batch/sequence
    dims: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        lora = None if self.lora is None else {"targets": list(self.lora.targets), "max_rank": self.lora.max_rank,
                                               "slots": self.lora.slots}
        out: dict[str, Any] = {"fold": self.fold, "precision": self.precision, "lora": lora}
        if self.dims:  # only when given: the cache keys of matrices without dims stay what they were
            out["dims"] = list(self.dims)
        return out


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    profiles: tuple[str, ...]
    pipeline: Pipeline = field(default_factory=Pipeline)


@dataclass(frozen=True)
class MatrixSpec:
    source: Path
    models: tuple[ModelEntry, ...]
    backend: str = "auto"
    shared_fs: bool = False
    triton_repo: Path | None = None


class _Reader:
    """Validation with the line of the offending key (tomllib gives values, not positions).

    A key of model ``nth`` (0-based) is looked up in that ``[[model]]`` table and its ``[model.*]`` sub-tables only,
    else the table's header line; a ``matrix.*`` / ``triton.*`` key in its own table: the nth occurrence of a key in
    the whole file named another model's line (a model without ``name`` before one with a bad name, a
    ``[model.pipeline]`` header counted as a ``[[model]]``, ``[matrix].profiles`` counted as model 0's)."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()
        self.sections: list[tuple[str, int, int]] = []  # (table name, header index, end index), in file order
        heads = [(i, re.sub(r"\s+", "", m[1])) for i, ln in enumerate(self.lines) if (m := _HEADER_RE.match(ln))]
        for k, (i, name) in enumerate(heads):
            self.sections.append((name, i, heads[k + 1][0] if k + 1 < len(heads) else len(self.lines)))

    def _span(self, nth: int | None, section: str) -> tuple[int, int] | None:
        """The line range of model ``nth`` (with its sub-tables) or of table ``section``; None when not found."""
        if nth is None:
            return next(((a, b) for name, a, b in self.sections if name == section), None)
        starts = [k for k, (name, _, _) in enumerate(self.sections) if name == "[model]"]
        if nth >= len(starts):
            return None
        k = starts[nth]
        end = k + 1
        while end < len(self.sections) and self.sections[end][0].startswith("model."):
            end += 1
        return self.sections[k][1], self.sections[end - 1][2]

    def line_of(self, key: str, nth: int | None = None, section: str = "") -> int | None:
        rx = re.compile(r"^\s*(\[\[?\s*)?" + re.escape(key) + r"\b")
        inline = re.compile(r"[{,]\s*" + re.escape(key) + r"\s*=")
        span = self._span(nth, section)
        lo, hi = span if span is not None else (0, len(self.lines))
        hits = [i + 1 for i in range(lo, hi) if rx.search(self.lines[i]) or inline.search(self.lines[i])]
        if span is not None:
            return hits[0] if hits and key != "model" else lo + 1  # else the table's header
        return hits[min(nth or 0, len(hits) - 1)] if hits else None

    def fail(self, key: str, problem: str, nth: int | None = None) -> InputError:
        section = key.split(".")[0] if nth is None and key.split(".")[0] in ("matrix", "triton") else ""
        line = self.line_of(key.split(".")[-1], nth, section)
        where = f"{self.path}:{line}" if line else str(self.path)
        return InputError(f"{where}: {key}: {problem}")

    def table(self, data: Any, key: str, allowed: set[str], nth: int | None = None) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail(key, "must be a table", nth)
        for k in data:
            if k not in allowed:
                import difflib

                near = difflib.get_close_matches(k, sorted(allowed), n=1)
                hint = f"did you mean '{near[0]}'?" if near else f"allowed: {', '.join(sorted(allowed))}"
                raise self.fail(f"{key}.{k}" if key else k, f"unknown key; {hint}", nth)
        return data

    def string_list(self, value: Any, key: str, nth: int | None = None) -> tuple[str, ...]:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, "must be a non-empty list of strings", nth)
        for v in value:
            self.no_nul(v, key, nth)
        return tuple(value)

    def no_nul(self, value: str, key: str, nth: int | None = None) -> str:
        """``value``, a name or path: a NUL character ("\\u0000" in TOML) is in no file name (os calls refuse it)."""
        if "\x00" in value:
            raise self.fail(key, f"{value!r} contains a NUL character, which no file or profile name can hold; remove "
                            "it", nth)
        return value

    def integer(self, value: Any, key: str, low: int, high: int, nth: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(key, f"must be an integer from {low} to {high} (got {value!r})", nth)
        return value


def _pipeline(r: _Reader, data: Any, nth: int) -> Pipeline:
    if data is None:
        return Pipeline()
    d = r.table(data, "pipeline", {"fold", "precision", "lora"}, nth)
    fold = d.get("fold", True)
    if not isinstance(fold, bool):
        raise r.fail("pipeline.fold", "must be true or false", nth)
    precision = d.get("precision")
    if precision is not None and precision not in PRECISIONS:
        raise r.fail("pipeline.precision", f"must be one of {', '.join(PRECISIONS)} (got {precision!r})", nth)
    lora = None
    if "lora" in d:
        ld = r.table(d["lora"], "pipeline.lora", {"targets", "max_rank", "slots"}, nth)
        if "targets" not in ld:
            raise r.fail("pipeline.lora", "needs targets = [\"q_proj\", ...]", nth)
        # the plugin's own bounds (``lora inject`` refuses others): max_rank 1000 passed here, then failed every cell
        lora = LoraStep(targets=r.string_list(ld["targets"], "pipeline.lora.targets", nth),
                        max_rank=r.integer(ld.get("max_rank", 16), "pipeline.lora.max_rank", 1, lora_spec.MAX_RANK,
                                           nth),
                        slots=r.integer(ld.get("slots", 8), "pipeline.lora.slots", 1, lora_spec.MAX_SLOTS, nth))
    return Pipeline(fold=fold, precision=precision, lora=lora)


def _model(r: _Reader, data: Any, nth: int, base: Path, default_profiles: tuple[str, ...] | None) -> ModelEntry:
    d = r.table(data, "model", {"path", "name", "profiles", "pipeline", "dims"}, nth)
    if not isinstance(d.get("path"), str) or not d["path"]:
        raise r.fail("model", "each [[model]] needs path = \"model.onnx\"", nth)
    path = (base / r.no_nul(d["path"], "path", nth)).resolve()
    if not path.is_file():  # a folder (or a FIFO) was said to be 'not found'
        what = "not found" if not path.exists() else "is not a regular file" + (" (a folder)" * path.is_dir())
        raise r.fail("path", f"model file {path} {what}; give the .onnx file's path (relative to the matrix file)", nth)
    name = d.get("name", path.stem)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise r.fail("name", f"{name!r} is not a valid name (letters, digits, _ . -; at most 128)", nth)
    # A profile listed twice is one cell (one folder, one build), not two builds racing for one folder.
    profiles = (tuple(dict.fromkeys(r.string_list(d["profiles"], "profiles", nth))) if "profiles" in d
                else default_profiles)
    if profiles is None:
        raise r.fail("model", "no profiles: set [matrix].profiles or profiles = [...] for this model", nth)
    pipeline = _pipeline(r, d.get("pipeline"), nth)
    if "dims" in d:
        pipeline = replace(pipeline, dims=_dims(r, d["dims"], nth))
    return ModelEntry(name=name, path=path, profiles=profiles, pipeline=pipeline)


def _dims(r: _Reader, data: Any, nth: int) -> tuple[str, ...]:
    """``dims = { num_patches = "1:64:256" }``: each a NAME=MIN:OPT:MAX item, checked as ``build --dim`` checks it."""
    from ..engine.shapes import parse_dims

    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise r.fail("dims", 'dims must be a table of "MIN:OPT:MAX" strings, e.g. dims = { patches = "1:16:64" }',
                     nth)
    items = tuple(sorted(f"{k}={v}" for k, v in data.items()))
    try:
        parse_dims(items, "dims")
    except InputError as exc:
        raise r.fail("dims", exc.message, nth) from exc
    return items


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a leading BOM (Windows editors) is skipped
    except FileNotFoundError as exc:
        raise InputError(f"matrix file {path} not found; give an existing .toml file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"matrix file {path}: cannot read it as UTF-8 text ({exc}); fix the file") from exc
    from trtforge.profiles.loader import read_toml

    return text, read_toml(text, f"matrix file {path}", "fix the file", InputError)


def load_matrix(path: str | Path) -> MatrixSpec:
    """Parse and validate a matrix file; raises InputError naming the line at fault."""
    src = Path(path).resolve()
    text, data = _read(src)
    r = _Reader(src, text)
    r.table(data, "", {"matrix", "model", "triton"})
    m = r.table(data.get("matrix", {}), "matrix", {"profiles", "backend", "shared_fs"})
    default_profiles = (tuple(dict.fromkeys(r.string_list(m["profiles"], "matrix.profiles"))) if "profiles" in m
                        else None)
    backend = m.get("backend", "auto")
    if backend not in BACKENDS:
        raise r.fail("matrix.backend", f"must be one of {', '.join(BACKENDS)} (got {backend!r})")
    shared_fs = m.get("shared_fs", False)
    if not isinstance(shared_fs, bool):
        raise r.fail("matrix.shared_fs", "must be true or false")
    models_data = data.get("model")
    if not isinstance(models_data, list) or not models_data:
        raise r.fail("model", "the matrix needs at least one [[model]] table with a path")
    models = tuple(_model(r, d, i, src.parent, default_profiles) for i, d in enumerate(models_data))
    names = [mo.name for mo in models]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise r.fail("name", f"two models are named {dup!r}; give each [[model]] a distinct name", names.index(dup))
    cells = sum(len(mo.profiles) for mo in models)
    if cells > MAX_CELLS:
        raise InputError(f"{src}: {cells} cells exceed the limit of {MAX_CELLS}; split the matrix into several files")
    triton = None
    if "triton" in data:
        t = r.table(data["triton"], "triton", {"repo"})
        if not isinstance(t.get("repo"), str) or not t["repo"]:
            raise r.fail("triton", "needs repo = \"path/to/model-repository\"")
        triton = (src.parent / r.no_nul(t["repo"], "triton.repo")).resolve()
        if triton.exists() and not triton.is_dir():  # every cell was built, then none was added (exit 0)
            raise r.fail("triton.repo", f"{triton} exists and is not a folder; give the Triton repository's folder")
    return MatrixSpec(source=src, models=models, backend=backend, shared_fs=shared_fs, triton_repo=triton)
