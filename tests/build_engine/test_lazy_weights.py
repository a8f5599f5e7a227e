"""Weights left on disk (issue 18.5): ``fold`` and ``precision`` read a model's big external tensors only from their
file, and their outputs are byte for byte what the in-memory path writes; the plan streamed during TensorRT's
serialisation is hashed and written whole, and a failed write fails the build."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from trtforge.build_engine.cli import main
from trtforge.build_engine.core import lazy_weights, onnx_io, onnx_save
from trtforge.build_engine.passes import fold
from trtforge.build_engine.precision.convert import convert_precision


def _model(path: Path, seed: int) -> Path:
    """x[1,256] @ W[256,2048] (2 MiB, stays on disk) + b (small, read), with an exact f32->f64->f32 round trip and an
    Identity for fold to remove, and a Cast of a small constant; all tensors in one external data file."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((256, 2048)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(2048).astype(np.float32), "b")
    c = numpy_helper.from_array(rng.integers(-5, 5, 2048).astype(np.int32), "c")
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
             h.make_node("Cast", ["a"], ["d"], to=T.DOUBLE), h.make_node("Cast", ["d"], ["f"], to=T.FLOAT),
             h.make_node("Identity", ["f"], ["i"]), h.make_node("Cast", ["c"], ["cf"], to=T.FLOAT),
             h.make_node("Mul", ["i", "cf"], ["y"])]
    g = h.make_graph(nodes, "lazy", [h.make_tensor_value_info("x", T.FLOAT, [1, 256])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 2048])], initializer=[w, b, c])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=0)
    return path


def _same_files(a: Path, b: Path) -> None:
    """Same graph (data file names aside) and same data bytes."""
    ga, gb = (onnx.load_model(str(p), load_external_data=False) for p in (a, b))
    for m in (ga, gb):
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = "data"
    assert ga.SerializeToString() == gb.SerializeToString()
    assert a.with_name(f"{a.name}.data").read_bytes() == b.with_name(f"{b.name}.data").read_bytes()


def test_lazy_load_leaves_only_big_tensors_on_disk(tmp_path: Path) -> None:
    src = _model(tmp_path / "m.onnx", seed=1)
    m = onnx_io.load(src, lazy=True).model
    where = {t.name: lazy_weights.on_disk(t) for t in m.graph.initializer}
    assert where == {"W": True, "b": False, "c": False}
    back = np.concatenate(list(lazy_weights.read_chunks(m.graph.initializer[0], tmp_path, "<f4", 100_000)))
    eager = onnx_io.load(src).model
    assert np.array_equal(back.reshape(256, 2048), numpy_helper.to_array(eager.graph.initializer[0]))


@pytest.mark.parametrize("command", ["fold", "precision"])
def test_outputs_equal_the_in_memory_path(tmp_path: Path, command: str) -> None:
    src = _model(tmp_path / "m.onnx", seed=2)
    out, ref = tmp_path / "out.onnx", tmp_path / "ref.onnx"
    extra = ["--to", "fp16"] if command == "precision" else []
    assert main([command, str(src), "-o", str(out), *extra]) == 0
    eager = onnx_io.load(src).model
    result = fold(eager).model if command == "fold" else convert_precision(eager, "fp16").model
    onnx_save.save_model(result, ref, external_data=True)
    _same_files(out, ref)
    if command == "fold":  # the exact round trip and the Identity are gone, the weights are all there
        ops = [n.op_type for n in onnx.load_model(str(out), load_external_data=False).graph.node]
        assert ops.count("Cast") < 3 and "Identity" not in ops


def test_fold_check_of_a_lazy_model_loads_the_weights_for_the_in_memory_check(tmp_path: Path) -> None:
    src = _model(tmp_path / "m.onnx", seed=3)
    out = tmp_path / "out.onnx"
    assert main(["fold", str(src), "-o", str(out), "--check"]) == 0  # 0: the check ran and passed
    assert out.with_name("out.onnx.data").stat().st_size >= 256 * 2048 * 4


def _trt() -> object:
    return pytest.importorskip("tensorrt_rtx")


def test_plan_stream_writes_and_hashes_every_chunk(tmp_path: Path) -> None:
    from trtforge.build_engine.engine.plan_stream import PlanStream

    rng = np.random.default_rng(4)
    chunks = [rng.bytes(int(n)) for n in rng.integers(1, 3_000_000, 7)]
    stream = PlanStream(_trt(), tmp_path / "model.plan")  # type: ignore[arg-type]
    assert all(stream.writer.write(memoryview(c)) == len(c) for c in chunks)
    sha = stream.finish()
    assert (tmp_path / "model.plan").read_bytes() == b"".join(chunks)
    assert sha == hashlib.sha256(b"".join(chunks)).hexdigest()


def test_plan_stream_write_failure_is_raised(tmp_path: Path) -> None:
    from trtforge.build_engine.engine.plan_stream import PlanStream

    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    stream = PlanStream(_trt(), Path("/dev/full"))  # type: ignore[arg-type]
    for _ in range(8):
        if stream.writer.write(memoryview(b"x" * (1 << 20))) == 0:
            break  # TensorRT would now fail the build
    with pytest.raises(OSError):
        stream.finish()


def test_only_main_graph_initializers_stay_on_disk(tmp_path: Path) -> None:
    """A big Constant node's tensor in external data is read: the save copies only initializers from the source, so
    anything else left on disk would point into the wrong file."""
    rng = np.random.default_rng(5)
    value = rng.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
    nodes = [h.make_node("Constant", [], ["k"], value=numpy_helper.from_array(value, "k")),
             h.make_node("Add", ["x", "k"], ["a"]), h.make_node("Identity", ["a"], ["y"])]
    g = h.make_graph(nodes, "const", [h.make_tensor_value_info("x", T.FLOAT, [512, 1024])],
                     [h.make_tensor_value_info("y", T.FLOAT, [512, 1024])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    src = tmp_path / "c.onnx"
    onnx.save_model(m, str(src), save_as_external_data=True, location="c.onnx.data", size_threshold=0,
                    convert_attribute=True)
    assert onnx.load_model(str(src), load_external_data=False).graph.node[0].attribute[0].t.data_location == 1
    out = tmp_path / "out.onnx"
    assert main(["fold", str(src), "-o", str(out)]) == 0
    src.with_name("c.onnx.data").unlink()  # the output must not need the source's data
    import onnxruntime as ort

    x = rng.standard_normal((512, 1024)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (y,) = ort.InferenceSession(str(out), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.array_equal(y, x + value)
