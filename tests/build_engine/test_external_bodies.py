"""Models whose external data lives in If/Loop bodies (body initializers and body Constants, saved by onnx's own
``save_as_external_data``), with or without external main-graph weights, through every command that reads or writes
a model: nothing crashes, every body weight reaches the output unchanged (the outputs are compared with the same
model held inline), body tensors that were external stay external, and the input's data file is never touched."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge_testing import seeded_rng

_H = 8
_DATA = "m.onnx.data"


def _vec(rng: np.random.Generator, name: str) -> onnx.TensorProto:
    return nh.from_array((rng.standard_normal((4, 8, _H)) * 0.5).astype(np.float32), name)  # 1 KiB


def _branch(rng: np.random.Generator, name: str) -> onnx.GraphProto:
    """``(x + w) * k``: w a body initializer, k a body Constant."""
    return h.make_graph([h.make_node("Constant", [], [f"{name}_k"], value=_vec(rng, f"{name}_c")),
                         h.make_node("Add", ["x", f"{name}_w"], [f"{name}_a"]),
                         h.make_node("Mul", [f"{name}_a", f"{name}_k"], [f"{name}_o"])], name, [],
                        [h.make_tensor_value_info(f"{name}_o", T.FLOAT, [4, 8, _H])], [_vec(rng, f"{name}_w")])


def _model(label: str, big_main: bool = False) -> onnx.ModelProto:
    """y = q_proj(x) + Loop(2 trips: v + loop_w)(If(c, then, else)), plus a 1 KiB main-graph bias with ``big_main``
    (external too once saved); the 256 B projection weight stays inline."""
    rng = seeded_rng(label)
    vi = h.make_tensor_value_info
    w = nh.from_array((rng.standard_normal((_H, _H)) * 0.3).astype(np.float32), "q_proj.weight")
    body = h.make_graph([h.make_node("Add", ["v", "loop_w"], ["v2"]), h.make_node("Identity", ["cond"], ["cond2"])],
                        "body", [vi("i", T.INT64, []), vi("cond", T.BOOL, []), vi("v", T.FLOAT, [4, 8, _H])],
                        [vi("cond2", T.BOOL, []), vi("v2", T.FLOAT, [4, 8, _H])], [_vec(rng, "loop_w")])
    nodes = [h.make_node("MatMul", ["x", "q_proj.weight"], ["y0"], name="q_proj/MatMul"),
             h.make_node("If", ["c"], ["if_out"], then_branch=_branch(rng, "then"), else_branch=_branch(rng, "else")),
             h.make_node("Loop", ["trips", "cond0", "if_out"], ["loop_out"], body=body),
             h.make_node("Add", ["loop_out", "y0"], ["y1" if big_main else "y"])]
    inits = [w, nh.from_array(np.array(2, np.int64), "trips"), nh.from_array(np.array(True), "cond0")]
    if big_main:
        nodes.append(h.make_node("Add", ["y1", "bias"], ["y"]))
        inits.append(_vec(rng, "bias"))
    g = h.make_graph(nodes, "g", [vi("x", T.FLOAT, [4, 8, _H]), vi("c", T.BOOL, [1])], [vi("y", T.FLOAT, [4, 8, _H])],
                     inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def _save_external(m: onnx.ModelProto, path: Path, constants: bool = True) -> None:
    """onnx's own external-data save (it converts body tensors too; ``constants``: Constant values as well), of a
    copy: onnx's save moves the data out of the proto it is given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    copy = onnx.ModelProto()
    copy.CopyFrom(m)
    onnx.save_model(copy, path, save_as_external_data=True, all_tensors_to_one_file=True, size_threshold=1024,
                    location=_DATA, convert_attribute=constants)


def _body_tensors(m: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    from trtforge.build_engine.core.onnx_tensors import besides_initializers

    return {t.name: t for t in besides_initializers(m) if t.name.endswith(("_w", "_c"))}


def _locations(path: Path) -> dict[str, str]:
    """Each body tensor's external location, or "inline"."""
    m = onnx.load(path, load_external_data=False)
    return {name: next((e.value for e in t.external_data if e.key == "location"), "?")
            if t.data_location == T.EXTERNAL else "inline" for name, t in _body_tensors(m).items()}


def _case(tmp_path: Path, label: str, big_main: bool = False, constants: bool = True) -> tuple[Path, Path]:
    """(the model saved with external data, the same model inline), each in its own folder."""
    m = _model(label, big_main)
    ext, inline = tmp_path / "ext" / "m.onnx", tmp_path / "inline" / "m.onnx"
    _save_external(m, ext, constants)
    inline.parent.mkdir()
    onnx.save_model(m, inline)
    expect = {"then_w", "else_w", "loop_w", *(("then_c", "else_c") if constants else ())}
    assert {n for n, loc in _locations(ext).items() if loc == _DATA} == expect
    return ext, inline


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _outputs(path: Path, seed_label: str) -> list[bytes]:
    """The model's output bytes (onnxruntime, no graph optimization) for both branches on fresh random inputs;
    extra inputs (LoRA pools) get random values, slot ids 0."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    rng = seeded_rng(seed_label)
    feeds: dict[str, Any] = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 2 for d in i.shape]
        if i.type == "tensor(int32)":
            feeds[i.name] = np.zeros(shape, np.int32)
        elif i.type == "tensor(float16)":
            feeds[i.name] = rng.standard_normal(shape).astype(np.float16)
        elif i.type == "tensor(float)":
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    out = []
    for c in (True, False):
        feeds["c"] = np.array([c])
        out.append(np.asarray(sess.run(None, feeds)[0]).tobytes())
    return out


def _assert_like(got: Path, want: Path, label: str) -> None:
    assert _outputs(got, label) == _outputs(want, label)


@pytest.fixture
def lora_pair(cli: Any, tmp_path: Path) -> tuple[Path, Path]:
    """A LoRA-injected model whose only external tensors are in its If/Loop bodies, and the same model inline."""
    m = _model("lora bodies")
    base = tmp_path / "base.onnx"
    onnx.save_model(m, base)
    res = cli("lora", "inject", base, "-o", tmp_path / "lora.onnx", "--targets", "q_proj", "--max-rank", "4",
              "--slots", "2")
    assert res.code == 0, res.err
    lora = onnx.load(tmp_path / "lora.onnx")
    ext, inline = tmp_path / "a" / "m.onnx", tmp_path / "inline" / "m.onnx"
    _save_external(lora, ext, constants=False)
    inline.parent.mkdir()
    onnx.save_model(lora, inline)
    assert onnx.load(ext, load_external_data=False).graph.initializer[0].data_location != T.EXTERNAL
    assert set(_locations(ext).values()) == {_DATA, "inline"}  # body initializers out, Constants in
    return ext, inline


def test_diff_of_a_lora_model_with_external_tensors_only_in_bodies(cli: Any, tmp_path: Path,
                                                                    lora_pair: tuple[Path, Path]) -> None:
    # exit 3: decompose's in-memory checker looked for the body tensors' data file in the working directory
    a, _ = lora_pair
    b = tmp_path / "b" / "m.onnx"
    shutil.copytree(a.parent, b.parent)
    res = cli("diff", a, b, "--atol", "0", "--rtol", "0")
    assert res.code == 0, res.err
    assert "outputs match" in res.out
    # a real comparison: the body weights of B changed (both branches, both runs) is a mismatch
    data = bytearray((b.parent / _DATA).read_bytes())
    m = onnx.load(b, load_external_data=False)
    for name, t in _body_tensors(m).items():
        if name in ("then_w", "else_w") and t.data_location == T.EXTERNAL:
            info = {e.key: int(e.value) for e in t.external_data if e.key in ("offset", "length")}
            start = info["offset"]
            data[start:start + info["length"]] = np.full(info["length"] // 4, 3.0, np.float32).tobytes()
    (b.parent / _DATA).write_bytes(bytes(data))
    res = cli("diff", a, b, "--atol", "0", "--rtol", "0")
    assert res.code == 1, res.out + res.err


def test_lora_decompose_keeps_external_body_tensors(cli: Any, tmp_path: Path, lora_pair: tuple[Path, Path]) -> None:
    a, inline = lora_pair
    before = _digest(a.parent / _DATA)
    out, ref = tmp_path / "out" / "d.onnx", tmp_path / "ref.onnx"
    out.parent.mkdir()
    res = cli("lora", "decompose", a, "-o", out)
    assert res.code == 0, res.err
    assert cli("lora", "decompose", inline, "-o", ref).code == 0
    assert _digest(a.parent / _DATA) == before
    assert set(_locations(out).values()) == {"d.onnx.data", "inline"}
    onnx.checker.check_model(str(out))
    _assert_like(out, ref, "decompose bodies feeds")


def test_the_skeleton_checks_external_body_tensors_without_their_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # the in-memory checker resolved the body tensors' location against the working directory
    from trtforge.build_engine.core import onnx_io, onnx_skeleton
    from trtforge.build_engine.core.shape_inference import infer_shapes

    ext, _ = _case(tmp_path, "skeleton bodies")
    monkeypatch.chdir(tmp_path)
    model = onnx_io.load_structure(ext).model
    onnx_skeleton.check_model(model)
    inferred = infer_shapes(model, strict=True)
    assert {o.name for o in inferred.graph.output} == {"y"}
    assert set(_locations(ext).values()) == {_DATA}
    assert {next(e.value for e in t.external_data if e.key == "location")
            for t in _body_tensors(model).values()} == {_DATA}  # the model itself is not changed


def test_a_converted_skeleton_keeps_the_body_tensors_locations(tmp_path: Path) -> None:
    # the opset conversion copies the skeleton's graph, bodies included, into the model it returns
    from trtforge.build_engine.core import onnx_io
    from trtforge.build_engine.core.onnx_tensors import besides_initializers
    from trtforge.build_engine.precision.opset import at_opset

    ext, _ = _case(tmp_path, "opset bodies")
    out = at_opset(onnx_io.load_structure(ext).model, 19, 9, "this test")
    assert {e.value for t in besides_initializers(out) for e in t.external_data if e.key == "location"} == {_DATA}


@pytest.mark.parametrize("big_main", [False, True], ids=["bodies-only", "main-and-bodies"])
def test_fold_precision_quantize_keep_body_weights(cli: Any, tmp_path: Path, big_main: bool) -> None:
    ext, inline = _case(tmp_path, f"commands bodies {big_main}", big_main)
    before = _digest(ext.parent / _DATA)
    runs = [("fold", "f.onnx", ()), ("fold", "fc.onnx", ("--check",)), ("precision", "p.onnx", ("--to", "fp16")),
            ("quantize", "q.onnx", ("--mode", "int8"))]
    for cmd, name, extra in runs:
        out, ref = tmp_path / "out" / name, tmp_path / "ref" / name
        out.parent.mkdir(exist_ok=True)
        ref.parent.mkdir(exist_ok=True)
        res = cli(cmd, ext, "-o", out, *extra)
        assert res.code == 0, (cmd, res.err)
        assert cli(cmd, inline, "-o", ref, *extra).code == 0
        assert set(_locations(out).values()) == {f"{name}.data"}, (cmd, _locations(out))
        _assert_like(out, ref, f"{cmd} bodies feeds")
    assert _digest(ext.parent / _DATA) == before


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="tensorrt_rtx not installed")
@pytest.mark.parametrize("big_main", [False, True], ids=["bodies-only", "main-and-bodies"])
def test_build_keeps_body_tensors_external_in_model_onnx(cli: Any, tmp_path: Path, big_main: bool) -> None:
    # build's re-save of the converted model wrote the body tensors into model.onnx
    ext, inline = _case(tmp_path, f"build bodies {big_main}", big_main)
    before = _digest(ext.parent / _DATA)
    res = cli("build", ext, "--profile", "a10", "-o", tmp_path / "eng", "--backend", "tensorrt-rtx")
    assert res.code == 0, res.err
    assert cli("build", inline, "--profile", "a10", "-o", tmp_path / "ref", "--backend", "tensorrt-rtx").code == 0
    built = tmp_path / "eng" / "model.onnx"
    assert set(_locations(built).values()) == {"model.onnx.data"}, _locations(built)
    _assert_like(built, tmp_path / "ref" / "model.onnx", "build bodies feeds")
    assert _digest(ext.parent / _DATA) == before


def test_build_matrix_names_a_data_file_only_body_constants_use(tmp_path: Path) -> None:
    # only initializers were looked at: a data file that only Constants name was left out of the cell's cache key
    # and of the files shipped to a worker
    from trtforge.build_engine.matrix.cells import external_files

    m = _model("matrix constants")
    for t in _body_tensors(m).values():
        if t.name.endswith("_c"):  # the If branches' Constant values, and nothing else
            onnx.external_data_helper.set_external_data(t, "consts.bin")
    onnx.external_data_helper.write_external_data_tensors(m, str(tmp_path))
    onnx.save_model(m, tmp_path / "m.onnx")
    assert {loc for loc in _locations(tmp_path / "m.onnx").values()} == {"consts.bin", "inline"}
    assert external_files(tmp_path / "m.onnx") == [tmp_path / "consts.bin"]


def test_build_matrix_pipeline_keeps_body_tensors_external(tmp_path: Path) -> None:
    from trtforge.build_engine.matrix.spec import Pipeline
    from trtforge.build_engine.matrix.worker import apply_pipeline

    ext, inline = _case(tmp_path, "matrix pipeline bodies", big_main=True)
    out, steps = apply_pipeline(ext, Pipeline(fold=True, precision="fp16"), tmp_path / "out.onnx")
    ref, _ = apply_pipeline(inline, Pipeline(fold=True, precision="fp16"), tmp_path / "ref.onnx")
    assert steps == ["fold", "precision fp16"]
    assert set(_locations(out).values()) == {"out.onnx.data"}
    _assert_like(out, ref, "matrix pipeline feeds")


def test_demo_steps_keep_body_tensors_external(tmp_path: Path) -> None:
    from trtforge.examples import demo_steps

    ext, inline = _case(tmp_path, "demo steps bodies", big_main=True)
    for src, tag in ((ext, "e"), (inline, "i")):
        folder = tmp_path / tag
        folder.mkdir()
        demo_steps.fold_file(src, folder / "f.onnx", folder / "f.json")
        demo_steps.convert_file(folder / "f.onnx", folder / "p.onnx", "fp16", folder / "p.json")
        demo_steps.inject_file(folder / "p.onnx", folder / "l.onnx", ["q_proj"], 4, 2)
        demo_steps.decompose_file(folder / "l.onnx", folder / "d.onnx")
    for name in ("f", "p", "l", "d"):
        assert set(_locations(tmp_path / "e" / f"{name}.onnx").values()) == {f"{name}.onnx.data"}, name
    for name in ("f", "p", "d"):
        _assert_like(tmp_path / "e" / f"{name}.onnx", tmp_path / "i" / f"{name}.onnx", f"demo {name} feeds")


def test_calibration_copy_past_2_gib_puts_body_tensors_external(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # the size test counted main-graph initializers only, and the copy kept body tensors in the model file
    from trtforge.build_engine.core import onnx_io
    from trtforge.build_engine.quantize import calibrators

    ext, inline = _case(tmp_path, "calib bodies")
    model = onnx_io.load(ext).model
    limit = 5 * 1024  # the five 1 KiB body tensors are over it, the 256 B main weight is not
    monkeypatch.setattr(calibrators, "PROTO_LIMIT", limit)
    with calibrators._runnable(model) as copy:
        assert isinstance(copy, str)
        assert Path(copy).stat().st_size < limit
        assert set(_locations(Path(copy)).values()) == {"model.onnx.data"}
        _assert_like(Path(copy), inline, "calib copy feeds")
