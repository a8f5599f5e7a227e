"""quantize's node labels and --exclude patterns: an unnamed node is called by its index in the source model, however
many nodes the fold and the Gemm lowering remove or add first, and a plain pattern's numbers match whole."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.cli import main
from trtforge_testing import seeded_rng

H = 16
CHAIN = 12  # enough projections that a label like MatMul#1 is a prefix of MatMul#10 and MatMul#11


def _unnamed_chain(rng: np.random.Generator) -> onnx.ModelProto:
    """x -> Identity -> Gemm(+bias) -> 11 MatMuls, no node named: fold removes the Identity (node 0) and lowering
    inserts the Gemm's bias Add, so indices in the working copies differ from the source's by -1 and +1."""
    inits = [numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), f"w{i}") for i in range(CHAIN)]
    inits.append(numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), "b"))
    nodes = [helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("Gemm", ["xi", "w0", "b"], ["m0"])]
    nodes += [helper.make_node("MatMul", [f"m{i - 1}", f"w{i}"], [f"m{i}"]) for i in range(1, CHAIN)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, H])],
                              [helper.make_tensor_value_info(f"m{CHAIN - 1}", TensorProto.FLOAT, [4, H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _run(tmp_path: Path, model: onnx.ModelProto, exclude: str) -> tuple[dict, onnx.ModelProto]:
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "report.json"
    onnx.save(model, src)
    code = main(["quantize", str(src), "-o", str(out), "--mode", "int8", "--calib-size", "2", "--exclude", exclude,
                 "--report", str(rep)])
    assert code == 0
    return json.loads(rep.read_text()), onnx.load(str(out))


def _float_matmuls(model: onnx.ModelProto) -> set[str]:
    """Names of MatMuls whose weight input is still a float32 initializer (not behind a DequantizeLinear)."""
    inits = {t.name: t.data_type for t in model.graph.initializer}
    return {n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm")
            and inits.get(n.input[1]) == TensorProto.FLOAT}


@pytest.mark.parametrize("index", [2, 3, 11])
def test_an_unnamed_node_is_excluded_by_its_source_index(index: int, tmp_path: Path) -> None:
    model = _unnamed_chain(seeded_rng(f"labels-{index}"))
    label = f"MatMul#{index}"
    assert model.graph.node[index].op_type == "MatMul" and not model.graph.node[index].name
    report, out = _run(tmp_path, model, label)
    excluded = {e["name"]: e["reason"] for e in report["excluded"]}
    assert "--exclude" in excluded[label], excluded
    assert [n for n, why in excluded.items() if "--exclude" in why] == [label], excluded
    quantized = {n["name"] for n in report["nodes"]}
    # every other projection is named by its source index too (the LM head, node 12, stays float by default)
    assert quantized | set(excluded) == {"Gemm#1", *(f"MatMul#{i}" for i in range(2, CHAIN + 1))}
    assert label in _float_matmuls(out)


def test_the_callers_model_keeps_its_unnamed_nodes(tmp_path: Path) -> None:
    from trtforge.build_engine.quantize import QuantConfig, generate, quantize

    model = _unnamed_chain(seeded_rng("labels-api"))
    before = model.SerializeToString()
    cfg = QuantConfig(mode="int8", calib_size=2, exclude=("MatMul#4",))
    result = quantize(model, cfg, generate(model, 2, 8, 0))
    assert model.SerializeToString() == before
    assert "MatMul#4" in {e.name for e in result.report.excluded}


def _named_layers(rng: np.random.Generator) -> onnx.ModelProto:
    names = ["/layers.1/q_proj/MatMul", "/layers.10/q_proj/MatMul", "/layers.11/q_proj/MatMul",
             "/layers.2/k_proj/MatMul", "/lm_head/MatMul"]
    inits = [numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), f"w{i}")
             for i in range(len(names))]
    nodes, prev = [], "x"
    for i, name in enumerate(names):
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=name))
        prev = f"h{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, H])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4, H])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize(("pattern", "kept"), [
    ("layers.1", {"/layers.1/q_proj/MatMul"}),
    ("layers.1/", {"/layers.1/q_proj/MatMul"}),
    ("layers.10", {"/layers.10/q_proj/MatMul"}),
    ("q_proj", {"/layers.1/q_proj/MatMul", "/layers.10/q_proj/MatMul", "/layers.11/q_proj/MatMul"}),
    ("*layers.1*", {"/layers.1/q_proj/MatMul", "/layers.10/q_proj/MatMul", "/layers.11/q_proj/MatMul"}),
])
def test_a_plain_patterns_numbers_match_whole(pattern: str, kept: set[str], tmp_path: Path) -> None:
    report, _ = _run(tmp_path, _named_layers(seeded_rng(f"layers-{pattern}")), pattern)
    by_exclude = {e["name"] for e in report["excluded"] if "--exclude" in e["reason"]}
    assert by_exclude == kept, report["excluded"]
