"""Issue 11 "Data loss" cases: an output that is (or holds, or lies in) an input. Devices such as /dev/full are
tested at library level in test_paths.py (a regression here, run as root, would replace the device node).
Each builder gets an empty folder and returns the Case: argv and the words the one error line must hold."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import fixtures as fx


@dataclass
class Case:
    argv: list[str]
    needles: tuple[str, ...]
    code: int = 2
    cwd: Path | None = None
    extra_inputs: list[Path] = field(default_factory=list)  # besides every file under the folder


Builder = Callable[[Path], Case]
PATH_CASES: dict[str, Builder] = {}


def case(name: str) -> Callable[[Builder], Builder]:
    def register(fn: Builder) -> Builder:
        PATH_CASES[name] = fn
        return fn
    return register


def s(p: Path) -> str:
    return str(p)


@case("fold --report IN")
def _fold_report_in(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    return Case(["fold", s(m), "-o", s(t / "out.onnx"), "--report", s(m)], ("--report", "in.onnx"))


@case("fold -o IN")
def _fold_o_in(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    return Case(["fold", s(m), "-o", s(m)], ("-o", "in.onnx"))


@case("fold -o IN via ..")
def _fold_dotdot(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    (t / "sub").mkdir()
    return Case(["fold", s(m), "-o", s(t / "sub" / ".." / "in.onnx")], ("-o", "in.onnx"))


@case("fold -o symlink to IN")
def _fold_symlink(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    (t / "link.onnx").symlink_to(m)
    return Case(["fold", s(m), "-o", s(t / "link.onnx")], ("-o", "link.onnx"))


@case("fold -o hard link to IN")
def _fold_hardlink(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    os.link(m, t / "hard.onnx")
    return Case(["fold", s(m), "-o", s(t / "hard.onnx")], ("-o", "hard.onnx"))


@case("fold -o the input's external data file")
def _fold_ext_data(t: Path) -> Case:
    m = fx.external_model(t / "in.onnx")
    return Case(["fold", s(m), "-o", s(t / "in.onnx.data")], ("-o", "in.onnx.data"))


@case("fold -o X whose X.data is the input's data")
def _fold_ext_data_sibling(t: Path) -> Case:
    m = fx.external_model(t / "in.onnx")
    os.replace(t / "in.onnx.data", t / "x.onnx.data")
    import onnx

    model = onnx.load(m, load_external_data=False)
    for e in model.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "x.onnx.data"
    onnx.save(model, m)
    return Case(["fold", s(m), "-o", s(t / "x.onnx")], ("x.onnx.data",))


def _renamed_external(t: Path, model_name: str, data_name: str) -> Path:
    """``external_model`` saved as ``model_name`` (any suffix: the loaders read it as ONNX) with its data in
    ``data_name``."""
    import onnx

    m = fx.external_model(t / "tmp.onnx")
    model = onnx.load(m, load_external_data=False)
    for e in model.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = data_name
    os.replace(t / "tmp.onnx.data", t / data_name)
    m.unlink()
    onnx.save(model, t / model_name)
    return t / model_name


def _suffixless_case(cmd: list[str], more: list[str], model_name: str) -> Builder:
    # The data file of a model not named *.onnx was not protected: -o o.onnx deleted o.onnx.data (the input's
    # weights) when the small output went out inline.
    def build(t: Path) -> Case:
        m = _renamed_external(t, model_name, "o.onnx.data")
        return Case([*cmd, s(m), "-o", s(t / "o.onnx"), *more], ("-o", "o.onnx.data", model_name))
    return build


for _cmd, _more, _name in ((["fold"], [], "model.pb"), (["precision"], ["--to", "fp16"], "model"),
                           (["lora", "decompose"], [], "model.bin"), (["quantize"], ["--mode", "int8"], "m.onnx.bak")):
    PATH_CASES[f"{' '.join(_cmd)} {_name} whose data is OUT.data"] = _suffixless_case(_cmd, _more, _name)


@case("precision -o IN")
def _precision(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    return Case(["precision", s(m), "-o", s(m), "--to", "fp16"], ("-o", "in.onnx"))


@case("quantize --report IN")
def _quantize(t: Path) -> Case:
    m = fx.llama(t / "in.onnx")
    return Case(["quantize", s(m), "-o", s(t / "q.onnx"), "--mode", "int8", "--report", s(m)], ("--report",))


@case("lora inject -o IN")
def _inject(t: Path) -> Case:
    m = fx.llama(t / "in.onnx")
    return Case(["lora", "inject", s(m), "-o", s(m), "--targets", "q_proj"], ("-o", "in.onnx"))


@case("lora decompose -o IN")
def _decompose(t: Path) -> Case:
    m = fx.injected_model(t / "in.onnx")
    return Case(["lora", "decompose", s(m), "-o", s(m)], ("-o", "in.onnx"))


@case("lora pack -o ADAPTER/adapter_model.safetensors")
def _pack(t: Path) -> Case:
    a = fx.adapter(t / "ad")
    out = a / "adapter_model.safetensors"
    return Case(["lora", "pack", s(a), "--targets", "q_proj", "-o", s(out)], ("-o", "adapter_model.safetensors"))


@case("kv-plan --json config.json")
def _kv_plan(t: Path) -> Case:
    c = fx.hf_config(t / "config.json")
    return Case(["kv-plan", "--profile", "a100", "--model", s(c), "--json", s(c)], ("--json", "config.json"))


@case("simulate --json TRACE")
def _simulate(t: Path) -> Case:
    tr = fx.trace(t / "trace.jsonl")
    return Case(["simulate", "--trace", s(tr), "--profile", "a100", "--model", "llama-3.1-8b", "--policy",
                 "cache-aware", "--json", s(tr)], ("--json", "trace.jsonl"))


@case("simulate --plot PROFILE.toml")
def _simulate_plot(t: Path) -> Case:
    p = fx.profile(t / "prof.toml")
    return Case(["simulate", "--trace", "synthetic:4", "--profile", s(p), "--model", "llama-3.1-8b", "--policy",
                 "cache-aware", "--plot", s(p)], ("--plot", "prof.toml"))


@case("build src/in.onnx -o src --force")
def _build_src(t: Path) -> Case:
    (t / "src").mkdir()
    m = fx.tiny_model(t / "src" / "in.onnx")
    return Case(["build", s(m), "--profile", "a100", "-o", s(t / "src"), "--force"], ("-o", "in.onnx"))


@case("build -o . --force (folder holding the input)")
def _build_dot(t: Path) -> Case:
    fx.tiny_model(t / "in.onnx")
    return Case(["build", "in.onnx", "--profile", "a100", "-o", ".", "--force"], ("-o",), cwd=t)


@case("build --profile inside -o")
def _build_profile(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    (t / "eng").mkdir()
    p = fx.profile(t / "eng" / "p.toml")
    return Case(["build", s(m), "--profile", s(p), "-o", s(t / "eng"), "--force"], ("-o", "p.toml"))


@case("triton ENGINE --repo . --name ENGINE --force")
def _triton(t: Path) -> Case:
    fx.engine(t / "eng")
    return Case(["triton", "eng", "--repo", ".", "--name", "eng", "--force"], ("--name", "eng"), cwd=t)


@case("diff --save A")
def _diff(t: Path) -> Case:
    a = fx.tiny_model(t / "a.onnx")
    b = fx.tiny_model(t / "b.onnx")
    return Case(["diff", s(a), s(b), "--save", s(a)], ("--save", "a.onnx"))


@case("diff --save R.json whose R.summary.json is B")
def _diff_summary(t: Path) -> Case:
    a = fx.tiny_model(t / "a.onnx")
    b = fx.tiny_model(t / "r.summary.json")
    return Case(["diff", s(a), s(b), "--save", s(t / "r.json")], ("--save", "r.summary.json"))


@case("fold --report FIFO")
def _fifo(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    os.mkfifo(t / "pipe")
    return Case(["fold", s(m), "-o", s(t / "o.onnx"), "--report", s(t / "pipe")], ("--report", "pipe"))


@case("kv-plan --json SOCKET")
def _socket(t: Path) -> Case:
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(t / "sock"))  # the file stays after close
    sock.close()
    return Case(["kv-plan", "--profile", "a100", "--model", "llama-3.1-8b", "--json", s(t / "sock")],
                ("--json", "socket"))


@case("build-matrix: a cell folder holds a model")
def _matrix(t: Path) -> Case:
    # Cell m x a100 is written to OUT/m/a100/, replacing that folder: the model inside it must not be deleted.
    (t / "out" / "m" / "a100").mkdir(parents=True)
    fx.tiny_model(t / "out" / "m" / "a100" / "in.onnx")
    mat = t / "matrix.toml"
    mat.write_text('[matrix]\nprofiles = ["a100"]\n\n[[model]]\nname = "m"\npath = "out/m/a100/in.onnx"\n')
    return Case(["build-matrix", s(mat), "-o", s(t / "out")], ("-o", "in.onnx"))


@case("demo --workdir a folder of user files")
def _demo(t: Path) -> Case:
    # The demo writes fixed names (summary.md, 01_fold/...) into its workdir: a folder that is not an earlier demo
    # workdir is refused rather than written over.
    (t / "w").mkdir()
    (t / "w" / "summary.md").write_text("my notes\n")
    return Case(["demo", "--workdir", s(t / "w")], ("--workdir", "summary.md"))


@case("build-matrix: a [triton] entry holds a model")
def _matrix_triton(t: Path) -> Case:
    (t / "repo" / "m_a100").mkdir(parents=True)
    fx.tiny_model(t / "repo" / "m_a100" / "in.onnx")
    return Case(["build-matrix", _matrix_file(t, "a100", "repo/m_a100/in.onnx", triton=True), "-o", s(t / "out")],
                ("m_a100", "in.onnx"))


def _matrix_file(t: Path, profile: str, model: str, triton: bool = False) -> str:
    """A one-model, one-profile matrix file in ``t`` (with a [triton] repo "repo"), as the argument to give."""
    mat = t / "matrix.toml"
    mat.write_text(f'[matrix]\nprofiles = ["{profile}"]\n\n[[model]]\nname = "m"\npath = "{model}"\n'
                   + ('\n[triton]\nrepo = "repo"\n' if triton else ""))
    return s(mat)


# An empty or name-less output path (`-o "$OUT"` with OUT unset, `--save .`): lora inject and diff --save crashed
# (exit 3, ValueError from Path.with_name), kv-plan --json '' and diff --save '' exited 0 and wrote nothing.
@case("lora inject -o ''")
def _inject_empty(t: Path) -> Case:
    m = fx.llama(t / "in.onnx")
    return Case(["lora", "inject", s(m), "-o", "", "--targets", "q_proj"], ("-o", "not a file path"))


@case("diff --save .")
def _diff_dot(t: Path) -> Case:
    a = fx.tiny_model(t / "a.onnx")
    return Case(["diff", s(a), s(a), "--save", "."], ("--save", "not a file path"))


@case("diff --save ''")
def _diff_empty(t: Path) -> Case:
    a = fx.tiny_model(t / "a.onnx")
    return Case(["diff", s(a), s(a), "--save", ""], ("--save", "not a file path"))


@case("fold -o OUT.onnx/ (a trailing slash)")
def _fold_trailing_slash(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    return Case(["fold", s(m), "-o", s(t / "o.onnx") + "/"], ("-o", "not a file path"))


@case("kv-plan --json ''")
def _kv_empty(t: Path) -> Case:
    return Case(["kv-plan", "--profile", "a100", "--model", "llama-3.1-8b", "--json", ""], ("--json", "not a file"))


@case("build -o ''")
def _build_empty(t: Path) -> Case:
    m = fx.tiny_model(t / "in.onnx")
    return Case(["build", s(m), "--profile", "a100", "-o", ""], ("-o", "empty"))


# '-' (stdout by convention; 'cache key -' reads stdin) was written as a file or folder named '-' in the cwd.
@case("kv-plan --json -")
def _kv_dash(t: Path) -> Case:
    return Case(["kv-plan", "--profile", "a100", "--model", "llama-3.1-8b", "--json", "-"], ("--json", "stdout"))


@case("triton --repo -")
def _triton_dash(t: Path) -> Case:
    return Case(["triton", s(t), "--repo", "-", "--name", "m"], ("--repo", "stdout"))


@case("build -o -")
def _build_dash(t: Path) -> Case:
    return Case(["build", s(fx.tiny_model(t / "in.onnx")), "--profile", "a100", "-o", "-"], ("-o", "stdout"))


# A .toml profile of a matrix was not an input: build-matrix deleted it when it lay in the cell folder it replaced
# (OUT/<model>/<profile name>/) or in a [triton] entry (named by the profile's `name`, not its file stem).
@case("build-matrix: a cell folder holds a .toml profile")
def _matrix_profile(t: Path) -> Case:
    fx.tiny_model(t / "m.onnx")
    (t / "out" / "m" / "a100").mkdir(parents=True)
    fx.profile(t / "out" / "m" / "a100" / "prof.toml")
    return Case(["build-matrix", _matrix_file(t, "out/m/a100/prof.toml", "m.onnx"), "-o", s(t / "out")],
                ("-o", "prof.toml"))


@case("build-matrix: a [triton] entry holds a .toml profile")
def _matrix_triton_profile(t: Path) -> Case:
    fx.tiny_model(t / "m.onnx")
    (t / "repo" / "m_a100").mkdir(parents=True)
    fx.profile(t / "repo" / "m_a100" / "prof.toml")
    return Case(["build-matrix", _matrix_file(t, "repo/m_a100/prof.toml", "m.onnx", triton=True), "-o",
                 s(t / "out")], ("m_a100", "prof.toml"))


# The commit of -o o.onnx removes the o.onnx.<8 hex>.data files it does not use (an older output's data): an input
# renamed from an older output (`mv o.onnx keep.onnx`) reads one of them and lost its weights.
@case("fold keep.onnx -o o.onnx, keep.onnx reads o.onnx.<hex>.data")
def _fold_family(t: Path) -> Case:
    m = _renamed_external(t, "keep.onnx", "o.onnx.0123abcd.data")
    return Case(["fold", s(m), "-o", s(t / "o.onnx")], ("-o", "o.onnx.0123abcd.data", "keep.onnx"))


@case("precision keep.onnx -o o.onnx, keep.onnx reads o.onnx.<hex>.data")
def _precision_family(t: Path) -> Case:
    m = _renamed_external(t, "keep.onnx", "o.onnx.0123abcd.data")
    return Case(["precision", s(m), "-o", s(t / "o.onnx"), "--to", "fp16"], ("-o", "o.onnx.0123abcd.data"))


# A FIFO (no writer) as a text input: simulate, kv-plan, cache key and build-matrix blocked in open() forever.
def _unblock_later(fifo: Path, after_s: float = 20.0) -> None:
    """A regression must fail, not hang the suite: if a reader is still blocked on ``fifo`` after ``after_s``, open
    it for writing once (the reader then reads end-of-file) and close it."""
    import contextlib
    import threading

    def unblock() -> None:
        with contextlib.suppress(OSError):  # ENXIO when nobody reads: nothing to unblock
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(after_s, unblock)
    timer.daemon = True
    timer.start()


def _fifo_input_case(argv: Callable[[str], list[str]], label: str) -> Builder:
    def build(t: Path) -> Case:
        os.mkfifo(t / "in.fifo")
        _unblock_later(t / "in.fifo")
        return Case(argv(s(t / "in.fifo")), (label, "FIFO"))
    return build


for _name, _argv, _label in (
        ("simulate --trace FIFO", lambda f: ["simulate", "--trace", f, "--profile", "a100", "--model", "llama-3.1-8b",
                                             "--policy", "cache-aware"], "--trace"),
        ("kv-plan --model FIFO", lambda f: ["kv-plan", "--profile", "a100", "--model", f], "--model"),
        ("cache key FIFO", lambda f: ["cache", "key", f], "REQUEST.json"),
        ("build-matrix FIFO", lambda f: ["build-matrix", f, "-o", "out"], "MATRIX.toml")):
    PATH_CASES[_name] = _fifo_input_case(_argv, _label)
