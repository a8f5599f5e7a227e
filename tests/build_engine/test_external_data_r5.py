"""External data in, external data out, for every kind of tensor: initializers of If bodies at any depth, Constant
values (main graph, bodies, model-local functions) and sparse initializers that were external in the input are
external in the output of ``fold``, ``precision`` and the byte-copying save of ``lora inject``. Each case failed
before its fix (the tensors were written into the model file, or pointed at the input's data file)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from trtforge_testing import seeded_rng

_N = 65536  # 256 KiB per float tensor: the model file must stay far smaller than any one of them


def _vec(rng: np.random.Generator, name: str) -> onnx.TensorProto:
    return nh.from_array(rng.standard_normal(_N).astype(np.float32), name)


def _model(rng: np.random.Generator, sparse: bool = True) -> onnx.ModelProto:
    """y = If(c, then: If(c, x + w_inner, x + w_then), else: Constant) + Constant k + f(x) + sparse Constant s,
    where f is a model-local function holding a Constant (without ``sparse``, y = y4: onnx.reference cannot run a sparse
    Constant)."""
    vi = h.make_tensor_value_info
    inner_t = h.make_graph([h.make_node("Add", ["x", "wi"], ["it"])], "inner_t", [], [vi("it", T.FLOAT, [_N])],
                           [_vec(rng, "wi")])
    inner_e = h.make_graph([h.make_node("Add", ["x", "wt"], ["ie"])], "inner_e", [], [vi("ie", T.FLOAT, [_N])],
                           [_vec(rng, "wt")])
    then_g = h.make_graph([h.make_node("If", ["c"], ["t"], then_branch=inner_t, else_branch=inner_e)], "then", [],
                          [vi("t", T.FLOAT, [_N])])
    else_g = h.make_graph([h.make_node("Constant", [], ["e"], value=_vec(rng, "ce"))], "else", [],
                          [vi("e", T.FLOAT, [_N])])
    fn = h.make_function("local", "addc", ["a"], ["b"],
                         [h.make_node("Constant", [], ["fc"], value=_vec(rng, "fc")),
                          h.make_node("Add", ["a", "fc"], ["b"])],
                         [h.make_opsetid("", 17)])
    values = nh.from_array(rng.standard_normal(512).astype(np.float32), "s")  # 2 KiB, its 4 KiB of indices inline
    indices = nh.from_array(np.arange(0, _N, _N // 512, dtype=np.int64), "s_idx")
    nodes = [h.make_node("If", ["c"], ["y0"], then_branch=then_g, else_branch=else_g),
             h.make_node("Constant", [], ["k"], value=_vec(rng, "k")),
             h.make_node("Cast", ["y0"], ["y1"], to=T.FLOAT),
             h.make_node("Add", ["y1", "k"], ["y2"]),
             h.make_node("addc", ["x"], ["y3"], domain="local"),
             h.make_node("Add", ["y2", "y3"], ["y4"]),
             h.make_node("Constant", [], ["s"], sparse_value=h.make_sparse_tensor(values, indices, [_N])),
             h.make_node("Add", ["y4", "s"], ["y"])]
    if not sparse:
        nodes[-2:] = [h.make_node("Identity", ["y4"], ["y"])]
    g = h.make_graph(nodes, "g", [vi("c", T.BOOL, []), vi("x", T.FLOAT, [_N])], [vi("y", T.FLOAT, [_N])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("local", 1)], functions=[fn])
    onnx.checker.check_model(m)
    return m


def _save_all_external(m: onnx.ModelProto, path: Path) -> None:
    """onnx.save_model with every tensor external; onnx leaves sparse tensors inline, so their values are moved here
    (the indices stay: onnx's checker cannot read external sparse indices)."""
    onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                    size_threshold=0, convert_attribute=True)
    saved = onnx.load(path, load_external_data=False)
    with open(path.parent / "w.bin", "ab") as fh:
        for sp in (a.sparse_tensor for n in saved.graph.node for a in n.attribute if a.HasField("sparse_tensor")):
            for t in (sp.values,):
                offset = fh.seek(0, 2)
                length = fh.write(t.raw_data)
                onnx.external_data_helper.set_external_data(t, "w.bin", offset, length)
                t.ClearField("raw_data")
    onnx.save_model(saved, path)
    onnx.checker.check_model(str(path))


def _sparse(m: onnx.ModelProto) -> list[Any]:
    return [a.sparse_tensor for n in m.graph.node for a in n.attribute if a.HasField("sparse_tensor")]


def _loaded(path: Path) -> onnx.ModelProto:
    """The model at ``path`` with every external tensor read, sparse ones too (onnx.load skips those)."""
    m = onnx.load(path, load_external_data=False)
    for t in [*onnx.external_data_helper._get_all_tensors(m), *(sp.values for sp in _sparse(m))]:
        if onnx.external_data_helper.uses_external_data(t):
            onnx.external_data_helper.load_external_data_for_tensor(t, str(path.parent))
    return m


def _values(path: Path) -> dict[str, bytes]:
    """Every tensor of the model at ``path`` by name (sparse ones as values and indices)."""
    m = _loaded(path)
    tensors = [*onnx.external_data_helper._get_all_tensors(m),
               *(t for sp in _sparse(m) for t in (sp.values, sp.indices))]
    return {t.name: nh.to_array(t).tobytes() for t in tensors}


def _run(path: Path, feeds: dict[str, Any]) -> bytes:
    outs: Any = ReferenceEvaluator(_loaded(path)).run(None, feeds)
    return bytes(np.asarray(outs[0]).tobytes())


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _case(tmp_path: Path, label: str, sparse: bool = True) -> tuple[Path, Path]:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    _save_all_external(_model(seeded_rng(label), sparse), src / "a.onnx")
    return src / "a.onnx", out


def _assert_external_out(src: Path, dst: Path, expect: dict[str, bytes]) -> None:
    assert dst.stat().st_size < 16384, dst.stat().st_size  # 6 tensors of 256 KiB: none is in the model file
    onnx.checker.check_model(str(dst))
    got = _values(dst)
    assert got == expect
    m = onnx.load(dst, load_external_data=False)
    tensors = [*onnx.external_data_helper._get_all_tensors(m), *(sp.values for sp in _sparse(m))]
    locations = {e.value for t in tensors for e in t.external_data if e.key == "location"}
    assert locations == {dst.name + ".data"}


def test_fold_keeps_every_external_tensor_external(cli: Any, tmp_path: Path) -> None:
    a, out = _case(tmp_path, "fold external kinds")
    before = _digests(a.parent)
    res = cli("fold", a, "-o", out / "b.onnx")
    assert res.code == 0, res.err
    assert _digests(a.parent) == before  # the input and its data file are untouched
    _assert_external_out(a, out / "b.onnx", _values(a))


def test_fold_output_with_external_body_tensors_runs_bit_exact(cli: Any, tmp_path: Path) -> None:
    a, out = _case(tmp_path, "fold external run", sparse=False)
    res = cli("fold", a, "-o", out / "b.onnx")
    assert res.code == 0, res.err
    _assert_external_out(a, out / "b.onnx", _values(a))
    rng = seeded_rng("fold external feeds")
    for c in (True, False):
        feeds = {"c": np.array(c), "x": rng.standard_normal(_N).astype(np.float32)}
        assert _run(out / "b.onnx", feeds) == _run(a, feeds)


def test_fold_check_keeps_every_external_tensor_external(cli: Any, tmp_path: Path) -> None:
    a, out = _case(tmp_path, "fold check external kinds")
    res = cli("fold", a, "-o", out / "b.onnx", "--check")
    assert res.code == 0, res.err
    _assert_external_out(a, out / "b.onnx", _values(a))


def test_precision_keeps_external_body_tensors_external(cli: Any, tmp_path: Path) -> None:
    a, out = _case(tmp_path, "precision external kinds")
    res = cli("precision", a, "-o", out / "p.onnx", "--to", "fp16")
    assert res.code == 0, res.err
    assert (out / "p.onnx").stat().st_size < 16384
    onnx.checker.check_model(str(out / "p.onnx"))


def test_the_byte_copying_save_moves_every_external_tensor(tmp_path: Path) -> None:
    # the save of lora inject / decompose, diff's decomposition and build's model.onnx: a body's tensor kept the
    # input's location, a data file that does not exist beside the output
    from trtforge.build_engine.core import onnx_io, onnx_save

    a, out = _case(tmp_path, "byte copy external kinds")
    before = _digests(a.parent)
    loaded = onnx_io.load_structure(a)
    onnx_save.save_with_source_data(loaded.model, loaded.path, out / "l.onnx")
    assert _digests(a.parent) == before
    _assert_external_out(a, out / "l.onnx", _values(a))


def test_inline_tensors_stay_inline(cli: Any, tmp_path: Path) -> None:
    # only what came external goes external: a model whose body tensors are inline keeps them in the model file
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    onnx.save_model(_model(seeded_rng("inline kinds")), src / "a.onnx", save_as_external_data=True,
                    location="w.bin", size_threshold=0)  # main-graph initializers only (there are none): no attribute
    res = cli("fold", src / "a.onnx", "-o", out / "b.onnx")
    assert res.code == 0, res.err
    # the three Constants' values (onnx put the body initializers out)
    assert (out / "b.onnx").stat().st_size > 3 * _N * 4


def test_a_model_with_a_sparse_initializer_loads(cli: Any, tmp_path: Path) -> None:
    # the loader read SparseTensorProto.name (there is none: it is values.name): exit 3, 'AttributeError: name'
    values = nh.from_array(np.array([1.5, -2.0], np.float32), "s")
    sp = h.make_sparse_tensor(values, nh.from_array(np.array([0, 3], np.int64), "s_idx"), [4])
    g = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [4])])
    g.sparse_initializer.append(sp)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    onnx.save_model(m, tmp_path / "a.onnx")
    res = cli("fold", tmp_path / "a.onnx", "-o", tmp_path / "b.onnx")
    assert res.code == 0, res.err
    onnx.checker.check_model(str(tmp_path / "b.onnx"))
