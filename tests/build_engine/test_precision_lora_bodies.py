"""A LoRA plugin node whose output an If body reads from the outer scope stays float32 (policy rule 7), as any node
would: converted, the body (never converted) read a float16 value as float32 and the model was invalid (exit 2)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from trtforge.build_engine.precision.convert import convert_precision
from trtforge.plugins.lora.decompose import decompose
from trtforge.plugins.lora.inject import inject
from trtforge_testing import seeded_rng

HIDDEN = 8


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    """``y0 = x @ W`` (the LoRA target) read by the Add after an If whose branches both read ``y0``."""
    def branch(tag: str) -> onnx.GraphProto:
        w = nh.from_array(rng.standard_normal((HIDDEN,)).astype(np.float32), f"{tag}_w")
        return h.make_graph([h.make_node("Add", ["y0", f"{tag}_w"], [f"{tag}_o"])], tag, [],
                            [h.make_tensor_value_info(f"{tag}_o", T.FLOAT, None)], initializer=[w])

    nodes = [h.make_node("MatMul", ["x", "q_proj.weight"], ["y0"], name="q_proj"),
             h.make_node("If", ["c"], ["b"], then_branch=branch("then"), else_branch=branch("else")),
             h.make_node("Add", ["b", "y0"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, HIDDEN]),
                                  h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, HIDDEN])],
                     initializer=[nh.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) * 0.3,
                                                "q_proj.weight")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return inject(m, ["q_proj"], max_rank=4, slots=2)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(decompose(model).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("to", ["fp16", "bf16"])
def test_plugin_output_read_by_a_body_stays_fp32(to: str) -> None:
    rng = seeded_rng(f"precision-lora-bodies-{to}")
    src = _model(rng)
    out = convert_precision(src, to).model
    onnx.checker.check_model(out, full_check=True)
    (plugin,) = [n for n in out.graph.node if n.domain == "trtforge"]
    types = {i.name: i.type.tensor_type.elem_type for i in out.graph.input}
    assert types[plugin.input[2]] == T.FLOAT  # lora_a pool: the plugin runs in float32
    if to == "bf16":
        return  # onnxruntime's CPU provider has no bf16 MatMul: the check above is what holds there
    feeds = {"x": rng.standard_normal((2, HIDDEN)).astype(np.float32), "c": np.array(True)}
    for vi in src.graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name.startswith(("lora_a.", "lora_b.")):
            feeds[vi.name] = (rng.standard_normal(dims) * 0.1).astype(np.float32)
        elif vi.name.startswith("lora_scales."):
            feeds[vi.name] = rng.uniform(0.5, 2.0, dims).astype(np.float32)
        elif vi.name == "lora_slot_ids":
            feeds[vi.name] = rng.integers(0, 2, dims).astype(np.int32)
    for c in (True, False):
        feeds["c"] = np.array(c)
        ref, got = _run(src, feeds), _run(out, feeds)
        assert np.max(np.abs(got - ref)) <= 2e-2 * max(1.0, float(np.max(np.abs(ref))))
