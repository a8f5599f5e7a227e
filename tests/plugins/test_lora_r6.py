"""Round-6 QA regressions for ``trtforge lora inject``: projections inside If bodies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error

H, OUT_F = 8, 6


def _if_model(path: Path, rng: np.random.Generator, with_main: bool) -> None:
    """An If whose two branches each hold a q_proj MatMul (a merged decoder's cache / no-cache branches); with
    ``with_main`` a main-graph ``model.pre.q_proj`` MatMul feeds it."""
    vi = helper.make_tensor_value_info

    def branch(name: str) -> onnx.GraphProto:
        w = numpy_helper.from_array(rng.standard_normal((H, OUT_F)).astype(np.float32), f"model.{name}.q_proj.weight")
        node = helper.make_node("MatMul", ["x", w.name], [f"o_{name}"], name=f"/model/{name}/q_proj/MatMul")
        return helper.make_graph([node], name, [], [vi(f"o_{name}", TensorProto.FLOAT, [4, OUT_F])], [w])

    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch("a"), else_branch=branch("b"))]
    inits = []
    x_in = "x"
    if with_main:
        inits = [numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "model.pre.q_proj.weight")]
        nodes.insert(0, helper.make_node("MatMul", ["x0", "model.pre.q_proj.weight"], ["x"], name="pre"))
        x_in = "x0"
    g = helper.make_graph(nodes, "g", [vi("c", TensorProto.BOOL, []), vi(x_in, TensorProto.FLOAT, [4, H])],
                          [vi("y", TensorProto.FLOAT, [4, OUT_F])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("with_main", [False, True])
def test_target_matching_projections_inside_if_bodies_is_refused(cli, tmp_path: Path, rng: np.random.Generator,
                                                                  with_main: bool) -> None:
    # old: with a main-graph q_proj as well, --targets q_proj adapted it alone and left both branch q_projs without
    # the adapter (exit 0, "1 node"); with none it said "projections found: none" though the bodies hold two
    _if_model(tmp_path / "m.onnx", rng, with_main)
    res = cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--targets", "q_proj")
    assert_one_line_error(res, 2, "'q_proj'", "model.a.q_proj, model.b.q_proj", "If/Loop/Scan")
    assert not (tmp_path / "o.onnx").exists()
    if with_main:  # a target naming only the main graph's module still injects, one node
        res = cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--targets", "pre.q_proj")
        assert res.code == 0, res.err
        nodes = onnx.load(tmp_path / "o.onnx").graph.node
        assert [n.input[2] for n in nodes if n.op_type == "LoRAOpPluginDynamic"] == ["lora_a.model.pre.q_proj"]
