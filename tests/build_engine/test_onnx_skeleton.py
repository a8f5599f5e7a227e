"""``onnx_skeleton.skeleton`` / ``onnx_skeleton.check_model``: the weight-free checks must reject exactly what
onnx's full checker rejects, keep every value's inferred type, and never touch the input model."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import ModelProto, TensorProto, helper, numpy_helper

from trtforge.build_engine.core import onnx_io, onnx_skeleton
from trtforge.build_engine.core.errors import ModelError


def _model(rng: np.random.Generator) -> ModelProto:
    """x [2, 64] @ W [64, 32] (a stood-in weight) + b [32] (small, stays), then Reshape by a small constant."""
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    shape = numpy_helper.from_array(np.array([4, 16], dtype=np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y0"]),
             helper.make_node("Reshape", ["y0", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [w, b, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _short_raw(m: ModelProto) -> None:
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:-4]


def _two_fields(m: ModelProto) -> None:
    m.graph.initializer[0].float_data.extend([1.0] * 2048)


def _wrong_field(m: ModelProto) -> None:
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.int32_data.extend([1] * 2048)


def _undefined_type(m: ModelProto) -> None:
    m.graph.initializer[0].data_type = TensorProto.UNDEFINED


def _string_raw(m: ModelProto) -> None:
    m.graph.initializer[0].data_type = TensorProto.STRING


def _negative_dim(m: ModelProto) -> None:
    m.graph.initializer[0].dims[0] = -64


def _duplicate_weight(m: ModelProto) -> None:
    m.graph.initializer.append(m.graph.initializer[0])


def _weight_shadows_node_output(m: ModelProto) -> None:
    m.graph.initializer[0].name = "h"
    m.graph.node[0].input[1] = "h"


def _unknown_op(m: ModelProto) -> None:
    m.graph.node[1].op_type = "NoSuchOp"


def _bad_small_init(m: ModelProto) -> None:
    m.graph.initializer[1].raw_data = m.graph.initializer[1].raw_data[:-4]


BREAKS: dict[str, Callable[[ModelProto], None]] = {
    "short raw_data": _short_raw, "two value fields": _two_fields, "wrong value field": _wrong_field,
    "undefined type": _undefined_type, "string in raw_data": _string_raw, "negative dim": _negative_dim,
    "duplicate weight": _duplicate_weight, "weight shadows a node output": _weight_shadows_node_output,
    "unknown op": _unknown_op, "bad small initializer": _bad_small_init,
}


def _rejects(check: Callable[[ModelProto], None], m: ModelProto) -> bool:
    try:
        check(m)
    except onnx.checker.ValidationError:
        return True
    return False


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_check_model_rejects_what_the_full_checker_rejects(name: str, rng: np.random.Generator) -> None:
    m = _model(rng)
    BREAKS[name](m)
    full = _rejects(onnx.checker.check_model, m)
    assert full, f"the full checker accepts {name!r}: the case proves nothing"
    assert _rejects(onnx_skeleton.check_model, m) == full


def _longer_raw(m: ModelProto) -> None:
    m.graph.initializer[0].raw_data += b"\0" * 8  # onnx only refuses too little data


def _fp16_weight(m: ModelProto) -> None:
    t = m.graph.initializer[0]
    t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), "W"))
    m.graph.node.insert(0, helper.make_node("Cast", ["W"], ["W32"], to=TensorProto.FLOAT))
    m.graph.node[1].input[1] = "W32"


def _typed_storage(m: ModelProto) -> None:
    t = m.graph.initializer[0]
    t.CopyFrom(helper.make_tensor("W", TensorProto.FLOAT, list(t.dims), numpy_helper.to_array(t).ravel().tolist()))


@pytest.mark.parametrize("change", [_longer_raw, _fp16_weight, _typed_storage])
def test_check_model_accepts_what_the_full_checker_accepts(change: Callable[[ModelProto], None],
                                                           rng: np.random.Generator) -> None:
    m = _model(rng)
    change(m)
    onnx.checker.check_model(m)
    onnx_skeleton.check_model(m)


def test_check_model_accepts_a_valid_model_and_skeleton_keeps_inferred_types(rng: np.random.Generator) -> None:
    m = _model(rng)
    before = m.SerializeToString()
    onnx_skeleton.check_model(m)
    skel = onnx_skeleton.skeleton(m)
    assert m.SerializeToString() == before  # the input is not touched
    assert [t.name for t in skel.graph.initializer] == ["b", "shape"]  # W is stood in for by a graph input
    assert "W" in {i.name for i in skel.graph.input}

    def types(model: ModelProto) -> dict[str, tuple[int, list[int]]]:
        g = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
        return {v.name: (v.type.tensor_type.elem_type, [d.dim_value for d in v.type.tensor_type.shape.dim])
                for v in [*g.value_info, *g.output]}

    assert types(skel) == types(m)
    assert types(m)["y"] == (TensorProto.FLOAT, [4, 16])  # the small Reshape target's values were read


def test_small_float_weights_are_stood_in_for_and_still_checked(rng: np.random.Generator) -> None:
    """Float initializers from 64 elements are stood in for (shape inference reads float values only as Resize
    scales); integer ones below 1024 keep their values (they may be shapes or indices); a malformed stood-in float
    tensor is still rejected, as the full checker rejects it."""
    bias = numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "bias")
    table = numpy_helper.from_array(rng.integers(0, 9, 96).astype(np.int64), "table")
    tiny = numpy_helper.from_array(rng.standard_normal(63).astype(np.float32), "tiny")
    nodes = [helper.make_node("Add", ["x", "bias"], ["h"]), helper.make_node("Gather", ["h", "table"], ["g"]),
             helper.make_node("Add", ["tiny", "tiny"], ["t"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [96])],
                              [helper.make_tensor_value_info("g", TensorProto.FLOAT, [96]),
                               helper.make_tensor_value_info("t", TensorProto.FLOAT, [63])], [bias, table, tiny])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    skel = onnx_skeleton.skeleton(m)
    assert sorted(t.name for t in skel.graph.initializer) == ["table", "tiny"]
    assert "bias" in {i.name for i in skel.graph.input}
    inferred = onnx.shape_inference.infer_shapes(skel, strict_mode=True).graph
    assert {v.name: v.type.tensor_type.elem_type for v in inferred.value_info} == {"h": TensorProto.FLOAT}
    onnx_skeleton.check_model(m)
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:-4]
    assert _rejects(onnx.checker.check_model, m) and _rejects(onnx_skeleton.check_model, m)


def test_load_rejects_a_truncated_weight(tmp_path, rng: np.random.Generator) -> None:
    m = _model(rng)
    _short_raw(m)
    path = tmp_path / "bad.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match="onnx.checker rejects"):
        onnx_io.load(path)
