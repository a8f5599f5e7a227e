"""Spec, NumPy reference, inject and decompose, checked by running real onnxruntime sessions."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.plugins import has_plugin_nodes
from trtforge.plugins.lora import reference, spec
from trtforge.plugins.lora.decompose import decompose
from trtforge.plugins.lora.inject import inject


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


@pytest.mark.parametrize("x_shape,slot_shape", [((7, 24), (7,)), ((2, 5, 24), (2, 5)), ((3, 4, 24), (3,))],
                         ids=["2d-token", "3d-token", "3d-sequence"])
def test_decompose_matches_reference_fp32(pool, single_op_model, x_shape, slot_shape):
    h, o, r, n = 24, 20, 4, 3
    feeds = pool(x_shape, slot_shape, h, o, r, n)
    model = decompose(single_op_model(x_shape, slot_shape, h, o, r, n))
    assert not has_plugin_nodes(model)
    (got,) = _run(model, feeds)
    want = reference.lora_op(feeds["x"], feeds["y"], feeds["a"], feeds["b"], feeds["ids"], feeds["scales"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # tokens without an adapter keep y's bits; tokens with one really changed
    off = reference.expand_slots(feeds["ids"], x_shape) < 0
    assert np.array_equal(got[off], feeds["y"][off])
    assert not np.allclose(got[~off], feeds["y"][~off])


def test_decompose_fp16_within_tolerance(pool, single_op_model):
    x_shape, slot_shape, h, o, r, n = (2, 6, 32), (2, 6), 32, 16, 8, 4
    feeds = pool(x_shape, slot_shape, h, o, r, n, dtype=np.float16)
    (got,) = _run(decompose(single_op_model(x_shape, slot_shape, h, o, r, n, np.float16)), feeds)
    assert got.dtype == np.float16
    want = reference.lora_op(feeds["x"], feeds["y"], feeds["a"], feeds["b"], feeds["ids"], feeds["scales"])
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_reference_per_sequence_equals_per_token_repeat(pool):
    f = pool((3, 4, 16), (3,), 16, 8, 4, 3)
    per_seq = reference.lora_op(f["x"], f["y"], f["a"], f["b"], f["ids"], f["scales"])
    per_tok = reference.lora_op(f["x"], f["y"], f["a"], f["b"], np.repeat(f["ids"][:, None], 4, 1), f["scales"])
    assert np.array_equal(per_seq, per_tok)
    with pytest.raises(InputError, match="slot ids"):
        reference.lora_op(f["x"], f["y"], f["a"], f["b"], np.full(3, 3, np.int32), f["scales"])


def test_fields_round_trip_and_validation():
    f = spec.LoraFields(16, 8, 4096, 1024, 64)
    assert spec.LoraFields.from_bytes(f.to_bytes()) == f
    assert spec.LoraFields.from_mapping({k: np.array([v], np.int32) for k, v in f.as_dict().items()}) == f
    with pytest.raises(InputError, match="max_rank"):
        spec.LoraFields(65, 8, 16, 16)
    with pytest.raises(InputError, match="tile"):
        spec.LoraFields(8, 8, 16, 16, 48)
    with pytest.raises(InputError, match="unknown"):
        spec.LoraFields.from_mapping({**f.as_dict(), "alpha": 2})
    assert spec.check_shapes(f, {"x": (2, 3, 4096), "y": (2, 3, 1024), "lora_a": (8, 4096, 16),
                                 "lora_b": (8, 16, 1024), "slot_ids": (2,), "scales": (8,)}) == "sequence"
    assert spec.tokens_per_slot((2, 3, 4096), (2, 3)) == 1 and spec.tokens_per_slot((2, 3, 4096), (2,)) == 3


def _example():
    from trtforge.examples.llama import make_llama

    return make_llama()


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["q_proj", "o_proj", "down_proj"]])
def test_inject_then_decompose_with_all_slots_off_is_bitwise_original(targets, rng: np.random.Generator):
    model = _example()
    lora = inject(model, targets, max_rank=8, slots=4)
    plugin_nodes = [n for n in lora.graph.node if n.op_type == spec.PLUGIN_NAME]
    assert len(plugin_nodes) == 2 * len(targets) and all(n.domain == spec.ONNX_DOMAIN for n in plugin_nodes)
    assert has_plugin_nodes(lora) and not has_plugin_nodes(model)
    assert any(i.domain == spec.ONNX_DOMAIN for i in lora.opset_import)
    dec = decompose(lora)
    b, s = 2, 5
    ids = rng.integers(0, 1024, size=(b, s)).astype(np.int64)
    feeds: dict[str, np.ndarray] = {"input_ids": ids, spec.SLOT_IDS_INPUT: np.full((b, s), -1, np.int32)}
    for i in dec.graph.input:
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.name.startswith(("lora_a.", "lora_b.")):
            feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
        elif i.name.startswith("lora_scales."):
            feeds[i.name] = rng.uniform(0.5, 2, dims).astype(np.float32)
    (base,) = _run(model, feeds)
    (off,) = _run(dec, feeds)
    assert np.array_equal(base.view(np.uint32), off.view(np.uint32))
    feeds[spec.SLOT_IDS_INPUT] = rng.integers(0, 4, size=(b, s)).astype(np.int32)
    (on,) = _run(dec, feeds)
    assert not np.allclose(on, base)  # adapters really change the logits


def test_inject_per_sequence_and_refusals():
    model = _example()
    lora = inject(model, ["self_attn.v_proj"], max_rank=4, slots=2, per_sequence=True)
    slot_in = next(i for i in lora.graph.input if i.name == spec.SLOT_IDS_INPUT)
    assert [d.dim_param for d in slot_in.type.tensor_type.shape.dim] == ["batch"]
    node = next(n for n in lora.graph.node if n.op_type == spec.PLUGIN_NAME)
    attrs = {a.name: a.i for a in node.attribute}
    assert attrs == {"max_rank": 4, "num_slots": 2, "in_features": 256, "out_features": 64}  # tile: the build's
    with pytest.raises(InputError, match="q_proj") as err:
        inject(model, ["qkv_proj"], 8, 4)
    assert "self_attn," not in str(err.value)  # attention score MatMuls (no weight) are not projections
    attn = inject(model, ["self_attn"], 4, 2)  # a parent module name selects its four projections only
    assert sum(n.op_type == spec.PLUGIN_NAME for n in attn.graph.node) == 8
    with pytest.raises(InputError, match="already"):
        inject(lora, ["v_proj"], 4, 2)
