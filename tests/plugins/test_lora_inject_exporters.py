"""inject finds projections in the torch.onnx dynamo exporter's output, where node names are ``node_linear_N``,
weights are ``val_N`` and the module path lives only in ``metadata_props`` (issue 18 item 3)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.plugins.lora.inject import inject, metadata_path, plan


def _dynamo_like(style: str, seed: int = 11) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for layer in range(2):
        outs = []
        for proj in ("q_proj", "v_proj", "o_proj"):
            k = len(inits)
            inits.append(numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"val_{k}"))
            node = helper.make_node("MatMul", [prev, f"val_{k}"], [f"linear_{k}"], name=f"node_linear_{k}")
            path = f"model.layers.{layer}.self_attn.{proj}"
            if style == "name_scopes":
                scopes = ["", "model", f"model.layers.{layer}", f"model.layers.{layer}.self_attn", path, f"linear_{k}"]
                helper.set_metadata_props(node, {"pkg.torch.onnx.name_scopes": repr(scopes)})
            else:
                ns = (f": m.LlamaForCausalLM/model: m.LlamaModel/model.layers.{layer}: m.LlamaDecoderLayer/"
                      f"model.layers.{layer}.self_attn: m.LlamaAttention/{path}: torch.nn.modules.linear.Linear/"
                      f"linear_{k}: aten.linear.default")
                helper.set_metadata_props(node, {"namespace": ns})
            nodes.append(node)
            outs.append(f"linear_{k}")
        nodes.append(helper.make_node("Sum", outs, [f"h{layer}"], name=f"node_add_{layer}"))
        prev = f"h{layer}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["b", "s", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("style", ["name_scopes", "namespace"])
def test_metadata_module_path_matches_targets(style: str) -> None:
    model = _dynamo_like(style)
    assert metadata_path(model.graph.node[0]) == "model.layers.0.self_attn.q_proj"
    sites = plan(model, ["q_proj", "v_proj"])
    assert [s.path for s in sites] == ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                       "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"]
    out = inject(model, ["self_attn.q_proj"], 4, 2)
    onnx.checker.check_model(out, full_check=True)
    assert sum(n.op_type == "LoRAOpPluginDynamic" for n in out.graph.node) == 2


def test_weight_name_through_transpose_chain() -> None:
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "model.layers.0.mlp.up_proj.weight")
    nodes = [helper.make_node("Transpose", ["model.layers.0.mlp.up_proj.weight"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wt"], ["y"], name="node_linear_0")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["t", 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert [s.path for s in plan(model, ["up_proj"])] == ["model.layers.0.mlp.up_proj"]


def test_real_torch_dynamo_export(tmp_path) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch", reason="exports with torch.onnx (torch is in the dev extra)")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript")

    class Attn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = torch.nn.Linear(16, 16, bias=False)
            self.v_proj = torch.nn.Linear(16, 16, bias=False)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.q_proj(x) + self.v_proj(x)

    torch.manual_seed(0)
    path = tmp_path / "dyn.onnx"
    torch.onnx.export(Attn().eval(), (torch.randn(2, 3, 16),), str(path), dynamo=True)
    model = onnx.load(str(path))
    assert not any("q_proj" in n.name for n in model.graph.node)  # the path is only in the metadata
    assert [s.path.split(".")[-1] for s in plan(model, ["q_proj", "v_proj"])] == ["q_proj", "v_proj"]
