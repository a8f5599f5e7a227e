"""The one rule that keeps a command from destroying its own inputs (issue 11, "Data loss").

Before anything is written, every output path is compared with every input path and every file an input depends
on (an ONNX model's external data files, whatever the model file is named: ``model.pb`` and ``model`` load as ONNX
too; every file under an input folder: a PEFT adapter, an engine folder). The comparison is by identity, not by
spelling: paths are resolved (symlinks, ``..``) and compared by ``(st_dev, st_ino)``, so hard links and the
case-folding of a case-insensitive filesystem are caught too.

Refused (``InputError``, exit 2, naming both paths), with or without ``--force``:

- an output file that is an input file (``fold in.onnx -o in.onnx``, ``--report in.onnx``, ``-o`` that writes
  ``OUT.onnx.data`` over the input's data file, ``lora pack -o ADAPTER/adapter_model.safetensors``);
- an output folder that is, or contains, an input (``build src/in.onnx -o src --force``; ``triton ENGINE --repo .
  --name ENGINE --force``): the folder is replaced as a whole, so everything inside it goes;
- an output that lies inside another output folder of the same command, or two outputs naming the same file;
- an output that exists and is not a regular file or folder (``/dev/full``, ``/dev/null``, a FIFO, a socket): it is
  never replaced by a regular file (``os.replace`` onto a device node would, for root, delete the device).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError
from .onnx_tensors import LOCATION_KEY

#: Files listed under one input folder. An input folder bigger than this is compared as a folder only (an output
#: inside it or equal to it is still caught, by its ancestry); stated so a huge tree cannot stall the check.
MAX_FOLDER_FILES = 100_000

PathLike = str | os.PathLike[str]
Named = tuple[str, PathLike | None]


@dataclass(frozen=True)
class _Input:
    label: str  # how the user named it: "IN.onnx", "--model", "--profile"
    path: Path  # as given (for messages)
    file: Path  # the file compared (the input itself or one it depends on)


def _ident(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino




def _names_external_data(model_path: Path) -> bool:
    """Whether the file holds the bytes of a ``location`` entry (scanned through mmap: no copy in memory)."""
    import mmap

    with open(model_path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return False
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return mm.find(LOCATION_KEY) >= 0


def external_data_files(model_path: Path) -> list[Path]:
    """The external data files an ONNX model names, read from its (weight-free) proto; [] if it cannot be parsed
    (the command's own loader then reports why)."""
    try:
        if not _names_external_data(model_path):
            return []  # a model with its weights inside is not parsed twice (it may be near 2 GiB)
        from onnx import ModelProto

        proto = ModelProto()
        proto.ParseFromString(model_path.read_bytes())
    except Exception:  # not ONNX or unreadable: no dependencies to protect; the loader names the problem
        return []
    from .onnx_io import external_locations

    return [model_path.parent / loc for loc in external_locations(proto)]


def _folder_files(folder: Path) -> Iterator[Path]:
    for n, p in enumerate(folder.rglob("*")):
        if n >= MAX_FOLDER_FILES:
            return
        yield p


def _expand(label: str, given: PathLike) -> list[_Input]:
    p = Path(given)
    out = [_Input(label, p, p)]
    if p.is_dir():
        out += [_Input(label, p, f) for f in _folder_files(p)]
    elif p.is_file():  # any name: the loaders read ``model.pb`` or ``model`` as ONNX too, data file and all
        out += [_Input(label, p, f) for f in external_data_files(p)]
    return out


def _kind(mode: int) -> str | None:
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None


def _special_kind(path: Path) -> str | None:
    """What ``path`` is when it is a FIFO, socket or device (None for anything else, or when it does not exist)."""
    try:
        return _kind(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None


def refuse_special(label: str, path: Path) -> None:
    kind = _special_kind(path)
    if kind is not None:
        raise InputError(f"{label} {path}: is {kind}, not a regular file; trtforge writes outputs by replacing the "
                         f"file, which would remove {path}; give a regular file path for {label}")


def _refuse_special_input(label: str, path: Path) -> None:
    """An input that is a FIFO, socket or device is refused: opening a FIFO with no writer blocks forever (the
    command hung until killed)."""
    kind = _special_kind(path)
    if kind is not None:
        raise InputError(f"{label} {path}: is {kind}, not a regular file; trtforge reads its inputs from files "
                         f"(save the stream to a file first); give a regular file for {label}")


def _inside(child: Path, folder_id: tuple[int, int]) -> bool:
    """Whether ``child`` (resolved) is ``folder`` or lies under it, by identity of each ancestor."""
    return any(_ident(anc) == folder_id for anc in (child, *child.parents))


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def _describe(inp: _Input) -> str:
    if inp.file == inp.path:
        return f"the input {inp.path} ({inp.label})"
    return f"{inp.file}, which the input {inp.path} ({inp.label}) depends on"


def check(*, inputs: Sequence[Named] = (), files: Sequence[Named] = (), folders: Sequence[Named] = ()) -> None:
    """Refuse (InputError) any output that would destroy an input; see the module docstring.

    ``inputs``: (label, path) of what the command reads; ``files``: output files (each replaced as a file);
    ``folders``: output folders (each replaced as a whole). ``None`` paths (options not given) are skipped.
    """
    for label, p in inputs:
        if p:
            _refuse_special_input(label, Path(p))
    ins = [i for label, p in inputs if p for i in _expand(label, p)]
    in_ids = [(_ident(i.file), i) for i in ins]
    for label, p in files:
        _refuse_empty(label, p)
    for label, p in folders:
        if p is not None and os.fspath(p) in ("", "-"):
            raise InputError(f"{label} {os.fspath(p)!r}: not an output folder (empty, or '-' for stdout); give an "
                             f"output folder for {label} (./- for a folder named '-')")
    outs = [(label, Path(p), False) for label, p in files if p] + [(label, Path(p), True) for label, p in folders if p]
    for label, out, is_folder in outs:
        refuse_special(label, out)
        oid = _ident(out)
        if oid is None:
            continue
        for iid, inp in in_ids:
            if iid is None:
                continue
            if iid == oid:
                raise InputError(f"{label} {out} is the same file as {_describe(inp)}; writing it would "
                                 f"overwrite that input, with or without --force; choose another {_option(label)} "
                                 "path")
            if is_folder and stat.S_ISDIR(os.stat(out).st_mode) and _inside(_real(inp.file), oid):
                raise InputError(f"{label} {out} contains {_describe(inp)}; an output folder may hold no input "
                                 f"(what is written there replaces what was there: the whole folder, or for "
                                 f"build-matrix each cell folder), with or without --force; choose an output folder "
                                 f"outside the inputs")
    _check_outputs_apart(outs)


def _check_outputs_apart(outs: Sequence[tuple[str, Path, bool]]) -> None:
    seen: dict[Path, str] = {}
    for label, out, _ in outs:
        key = _real(out)
        if key in seen:
            raise InputError(f"{out}: {label} and {seen[key]} name the same file; choose another {_option(label)} "
                             "path")
        seen[key] = label
    for flabel, folder, is_folder in outs:
        if not is_folder:
            continue
        froot = _real(folder)
        for label, out, _ in outs:
            if out is not folder and froot in _real(out).parents:
                raise InputError(f"{label} {out} lies inside {flabel} {folder}, which is replaced as a whole; "
                                 f"choose a {_option(label)} path outside it")


def _refuse_empty(label: str, path: PathLike | None) -> None:
    """``-o ''`` (an unset shell variable) is a given, empty path, not an absent option: it must not pass the checks
    as "not given" and then write, or be silently skipped; a path with no file name (``.``, ``/``) or one that ends
    in a separator (``out.onnx/``: the user meant a folder; ``Path`` drops the slash and would write a file) is a
    folder."""
    text = None if path is None else os.fspath(path)
    if text == "-":  # the usual spelling of stdout (and 'cache key -' reads stdin): not a file named '-'
        raise InputError(f"{label} '-': trtforge writes {label} to a file, not to stdout; give a file path (./- for "
                         "a file named '-')")
    if text is not None and (text == "" or text.endswith(os.sep) or Path(text).name in ("", "..")):
        raise InputError(f"{label} {text!r}: not a file path (empty, ending in {os.sep!r}, or a folder such as '.' "
                         f"or '/'); give a file name for {label}")


#: Appended to an output's option for the external-data files written beside it (``onnx_output``)
DATA_OF = "'s data file"


def _option(label: str) -> str:
    """The option to change when ``label``'s path is refused: a data file's is its model's (``-o``)."""
    return label.removesuffix(DATA_OF)


def onnx_output(label: str, path: PathLike | None) -> list[Named]:
    """An ONNX output, the external data file ``save_model`` may write beside it (``OUT.onnx.data``) and every
    existing file of its data family (``OUT.onnx.<8 hex>.data``), which the commit removes (``model_commit``): an
    input that reads one of those (``mv o.onnx keep.onnx; fold keep.onnx -o o.onnx``) would lose its weights."""
    _refuse_empty(label, path)
    if not path:
        return []
    from .model_commit import data_family

    p = Path(path)
    plain = p.with_name(f"{p.name}.data")
    parent = p.parent if str(p.parent) else Path(".")
    data = label + DATA_OF  # a refusal names the data file as what it is ("-o out.onnx.data" read as a typo)
    return [(label, p), (data, plain), *((data, f) for f in data_family(parent, p.name) if f.name != plain.name)]


__all__ = ["MAX_FOLDER_FILES", "check", "external_data_files", "onnx_output", "refuse_special"]
