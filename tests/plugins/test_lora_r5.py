"""Round-5 QA regressions for the LoRA plugin's CPU paths (decompose under diff, pack, inject)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error


def _projection(path: Path, rng: np.random.Generator) -> None:
    """x [2, 5, 16] -> MatMul(m.q_proj.weight [16, 24])."""
    w = numpy_helper.from_array(rng.standard_normal((16, 24)).astype(np.float32), "m.q_proj.weight")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "m.q_proj.weight"], ["q"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 16])],
                          [helper.make_tensor_value_info("q", TensorProto.FLOAT, [2, 5, 24])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("value, ok", [("3", False), ("7", False), ("2", True), ("-1", True)])
def test_diff_value_of_a_slot_beyond_the_pool_is_refused(cli, tmp_path: Path, rng: np.random.Generator,
                                                         value: str, ok: bool) -> None:
    # old: --value lora_slot_ids=3 with 3 slots ran the decomposed model and failed in onnxruntime's Gather, named
    # as the deleted '/tmp/trtforge-diff-*/a.decomposed.onnx' with a hint at --shape; now refused up front
    _projection(tmp_path / "m.onnx", rng)
    res = cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "l.onnx", "--targets", "q_proj",
              "--max-rank", "4", "--slots", "3")
    assert res.code == 0, res.err
    res = cli("diff", tmp_path / "l.onnx", tmp_path / "m.onnx", "--extra-inputs", "--value", f"lora_slot_ids={value}")
    if ok:  # a slot in [-1, 3) runs: -1 adds nothing (the outputs match), slot 2 its random adapter (they differ)
        assert res.code == (0 if value == "-1" else 1), res.err
    else:
        assert_one_line_error(res, 2, f"--value lora_slot_ids={value}", "3 slots", "-1 (no adapter) to 2")
        assert "decomposed" not in res.err


@pytest.mark.parametrize("w_shape, x_shape, y_shape", [((16,), [2, 5, 16], [2, 5]),
                                                       ((2, 16, 8), [2, 5, 16], [2, 5, 8])])
def test_inject_refuses_a_matmul_whose_weight_is_not_2d(cli, tmp_path: Path, rng: np.random.Generator,
                                                        w_shape: tuple[int, ...], x_shape: list[int],
                                                        y_shape: list[int]) -> None:
    # old: x [2, 5, 16] @ w [16] got a plugin node with out_features 5 (y's last dim, the sequence) and lora_b
    # [N, R, 5]: decompose's Add failed in onnxruntime and TensorRT-RTX built an engine of that shape; a batched
    # weight [2, 16, 8] got one too (no Linear/Conv1D: no PEFT adapter exists for it). Now refused, naming the weight
    w = numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "m.score.weight")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "m.score.weight"], ["s"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("s", TensorProto.FLOAT, y_shape)], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    res = cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "l.onnx", "--targets", "score")
    assert_one_line_error(res, 2, "'m.score.weight'", f"rank {len(w_shape)}", "2-D")
    assert not (tmp_path / "l.onnx").exists()
