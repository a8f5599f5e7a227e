"""trtforge diff: real Polygraphy Comparator runs over real onnxruntime sessions on tiny models built here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge_testing import assert_one_line_error

VOCAB, HIDDEN, OUT = 37, 8, 12


def _model(seed: int, *, scale: float = 1.0, in_name: str = "input_ids") -> onnx.ModelProto:
    """Embedding (Gather) -> MatMul -> Tanh, plus a second float input; dynamic batch/sequence."""
    rng = np.random.default_rng(seed)
    emb = numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "emb")
    w = numpy_helper.from_array((rng.standard_normal((HIDDEN, OUT)) * scale).astype(np.float32), "w")
    nodes = [helper.make_node("Gather", ["emb", in_name], ["e"]),
             helper.make_node("Add", ["e", "bias"], ["eb"]),
             helper.make_node("MatMul", ["eb", "w"], ["h"]),
             helper.make_node("Tanh", ["h"], ["logits"]),
             helper.make_node("ReduceSum", ["h"], ["total"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(in_name, TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", OUT]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [])], [emb, w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _perturb(model: onnx.ModelProto, name: str, index: int, delta: float) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        if init.name == name:
            arr = numpy_helper.to_array(init).copy()
            arr.flat[index] += delta
            init.CopyFrom(numpy_helper.from_array(arr, name))
    return out


@pytest.fixture
def pair(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, Path, Path]:
    seed = int(rng.integers(1 << 30))
    a, copy, bad = tmp_path / "a.onnx", tmp_path / "copy.onnx", tmp_path / "bad.onnx"
    model = _model(seed)
    onnx.save(model, a)
    copy.write_bytes(a.read_bytes())
    # one weight element changed: every token whose embedding row hits it differs
    onnx.save(_perturb(model, "w", 3, 0.5), bad)
    return a, copy, bad


def test_equal_bitwise_and_perturbed(pair, cli) -> None:
    a, copy, bad = pair
    res = cli("diff", a, copy, "--atol", "0", "--rtol", "0", "--seed", "7")
    assert res.code == 0, res.err
    assert "logits" in res.out and "total" in res.out and "outputs match" in res.out
    res = cli("diff", a, bad)
    assert_one_line_error(res, 1, "logits", "differ")
    assert "NO" in res.out


def test_tolerance_presets_decide(tmp_path: Path, cli) -> None:
    """A relative change of 1e-4 on one weight fails fp32 and passes the fp16 preset."""
    model = _model(3)
    w0 = float(numpy_helper.to_array(model.graph.initializer[1]).flat[0])
    onnx.save(model, tmp_path / "a.onnx")
    onnx.save(_perturb(model, "w", 0, abs(w0) * 1e-4 + 1e-6), tmp_path / "b.onnx")
    assert cli("diff", tmp_path / "a.onnx", tmp_path / "b.onnx").code == 1
    assert cli("diff", tmp_path / "a.onnx", tmp_path / "b.onnx", "--precision", "fp16").code == 0


def test_api_numbers_match_numpy(pair) -> None:
    from trtforge.build_engine.verify.diff import run_diff

    a, _, bad = pair
    result = run_diff(a, bad, seed=11, shapes={"input_ids": (3, 5), "bias": (3, 5, HIDDEN)})
    ids = next(i for i in result.inputs if i.name == "input_ids")
    assert ids.shape == (3, 5) and (ids.low, ids.high) == (0, VOCAB - 1)  # bounded by the embedding
    ra, rb = result.run_results[f"A:{a.name}"][0], result.run_results[f"B:{bad.name}"][0]
    la, lb = np.asarray(ra["logits"]), np.asarray(rb["logits"])
    logits = next(o for o in result.outputs if o.name == "logits")
    assert logits.max_abs == pytest.approx(float(np.abs(la - lb).max()))
    assert logits.total == la.size == 3 * 5 * OUT
    assert 0 < logits.mismatches < logits.total and not logits.passed
    # the mismatch count follows Polygraphy's element-wise rule (atol AND rtol exceeded)
    rel = np.abs(la - lb) / np.where(lb == 0, np.finfo(np.float64).eps, np.abs(lb))
    assert logits.mismatches == int(((np.abs(la - lb) > result.atol) & (rel > result.rtol)).sum())


def test_save_loads_in_polygraphy(pair, tmp_path: Path, cli) -> None:
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import AccuracyResults

    a, copy, _ = pair
    out = tmp_path / "r.json"
    assert cli("diff", a, copy, "--save", out).code == 0
    loaded = RunResults.load(str(out))
    names = [n for n, _ in loaded]
    assert names == [f"A:{a.name}", f"B:{copy.name}"]
    np.testing.assert_array_equal(np.asarray(loaded[names[0]][0]["logits"]),
                                  np.asarray(loaded[names[1]][0]["logits"]))
    acc = AccuracyResults.load(str(tmp_path / "r.accuracy.json"))
    assert bool(acc)
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["passed"] is True and {o["name"] for o in summary["outputs"]} == {"logits", "total"}


def test_bad_inputs_exit_2(pair, tmp_path: Path, cli) -> None:
    a, _, _ = pair
    other = tmp_path / "other.onnx"
    onnx.save(_model(1, in_name="tokens"), other)
    assert_one_line_error(cli("diff", a, other), 2, "input_ids", "tokens")
    assert_one_line_error(cli("diff", a, tmp_path / "missing.onnx"), 2, "missing.onnx")
    assert_one_line_error(cli("diff", a, a, "--shape", "nope:2,3"), 2, "nope")
    assert_one_line_error(cli("diff", a, a, "--shape", "input_ids"), 2, "--shape")
    assert_one_line_error(cli("diff", a, a, "--atol", "-1"), 2, "--atol")


def test_plugin_models_are_decomposed(tmp_path: Path, cli, rng: np.random.Generator) -> None:
    """LoRA-injected models (plugin nodes) are decomposed to standard ops before onnxruntime runs them; the slot
    ids are drawn from [-1, num_slots), and two copies compare bitwise equal."""
    from trtforge.build_engine.verify.diff import run_diff
    from trtforge.plugins.lora import inject as inject_mod

    h, o = 16, 16
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", h])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", o])
    w = numpy_helper.from_array(rng.standard_normal((h, o)).astype(np.float32),
                                "model.layers.0.self_attn.q_proj.weight")
    node = helper.make_node("MatMul", ["x", w.name], ["y"], name="/model/layers.0/self_attn/q_proj/MatMul")
    base = helper.make_model(helper.make_graph([node], "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])
    lora = inject_mod.inject(base, ["q_proj"], max_rank=4, slots=3)
    from trtforge.plugins import has_plugin_nodes

    assert has_plugin_nodes(lora)
    onnx.save(lora, tmp_path / "lora.onnx")
    onnx.save(lora, tmp_path / "lora2.onnx")
    result = run_diff(tmp_path / "lora.onnx", tmp_path / "lora2.onnx", atol=0, rtol=0)
    assert result.passed and len(result.decomposed) == 2
    slots = next(i for i in result.inputs if i.dtype == "int32")
    assert (slots.low, slots.high) == (-1, 2)  # slot ids bounded by the pool (num_slots 3), -1 = no adapter


def test_injected_with_no_adapter_equals_original(tmp_path: Path, cli, rng: np.random.Generator) -> None:
    """Original vs LoRA-injected (decomposed): with every slot id -1 the outputs are bitwise equal; with random
    slot ids and random pools they differ. The pool inputs exist only in the injected model (--extra-inputs)."""
    from trtforge.plugins.lora import inject as inject_mod
    from trtforge.plugins.lora import spec

    h = 16
    w = numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32),
                                "model.layers.0.self_attn.q_proj.weight")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", w.name], ["y"], name="/model/layers.0/self_attn/q_proj/MatMul")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", h])], [w])
    base = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(base, tmp_path / "base.onnx")
    onnx.save(inject_mod.inject(base, ["q_proj"], max_rank=4, slots=3), tmp_path / "lora.onnx")
    args = ("diff", tmp_path / "base.onnx", tmp_path / "lora.onnx", "--extra-inputs")
    res = cli(*args, "--value", f"{spec.SLOT_IDS_INPUT}=-1", "--atol", "0", "--rtol", "0")
    assert res.code == 0, res.out + res.err
    assert "decomposed" in res.out
    assert cli(*args).code == 1  # slot ids drawn from [-1, 3): adapters change y
    assert_one_line_error(cli("diff", tmp_path / "base.onnx", tmp_path / "lora.onnx"), 2, "--extra-inputs")
    assert_one_line_error(cli(*args, "--value", "nope=1"), 2, "nope")


def test_folded_weight_is_bitwise_equal(tmp_path: Path, cli, rng: np.random.Generator) -> None:
    """``x @ Identity(W)`` vs ``x @ W`` (what folding produces) must compare bitwise equal: onnxruntime prepacks
    only constant weights and a prepacked GEMM sums in another order, so diff runs sessions without prepacking or
    graph rewrites by default."""
    h = 256
    w = numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", h])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", h])
    with_identity = [helper.make_node("Identity", ["w"], ["w2"]), helper.make_node("MatMul", ["x", "w2"], ["y"])]
    plain = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    for name, nodes in (("a.onnx", with_identity), ("b.onnx", plain)):
        onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]),
                                    opset_imports=[helper.make_opsetid("", 17)]), tmp_path / name)
    res = cli("diff", tmp_path / "a.onnx", tmp_path / "b.onnx", "--atol", "0", "--rtol", "0", "--shape", "x:2,4,256")
    assert res.code == 0, res.out + res.err


def test_rel_to_scale_is_max_abs_over_reference_scale(rng: np.random.Generator) -> None:
    import numpy as np

    from trtforge.build_engine.verify.diff import _output_diff

    b = rng.standard_normal((3, 50)).astype(np.float32)
    a = b + rng.standard_normal(b.shape).astype(np.float32) * 1e-3
    d = _output_diff("y", a, b, 1e-2, 1e-3, True)
    expect = np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b.astype(np.float64)))
    assert d.rel_to_scale == expect
    assert d.rel_to_scale < d.max_rel  # element-wise relative error blows up near zero; the scale-relative one not


def _nan_model(path: Path) -> None:
    """Log of a random float input (NaN wherever it is negative), then Neg."""
    graph = helper.make_graph([helper.make_node("Log", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_bitwise_mode_passes_identical_nans(tmp_path: Path, cli, rng: np.random.Generator) -> None:
    """--atol 0 --rtol 0 is judged on bytes: a model against itself passes even where its outputs are NaN (Polygraphy's
    rule alone would fail every NaN); under a tolerance every NaN fails, and the message says that NaN is why."""
    a = tmp_path / "a.onnx"
    _nan_model(a)
    seed = str(int(rng.integers(1 << 30)))
    res = cli("diff", a, a, "--atol", "0", "--rtol", "0", "--seed", seed)
    assert res.code == 0, res.err
    res = cli("diff", a, a, "--seed", seed)
    assert_one_line_error(res, 1, "z", "NaN")


def test_bitwise_mismatches_count_differing_bytes(rng: np.random.Generator) -> None:
    from trtforge.build_engine.verify.compare import byte_mismatches, nan_count

    a = rng.standard_normal(64).astype(np.float32)
    a[rng.choice(64, 9, replace=False)] = np.nan
    b = a.copy()
    assert byte_mismatches(a, b) == 0 and nan_count(a, b) == 9
    b[np.isnan(b)] = -np.float32(np.nan)  # NaN with the sign bit set: other bytes
    flipped = np.signbit(a[np.isnan(a)]) != np.signbit(b[np.isnan(b)])
    assert byte_mismatches(a, b) == int(flipped.sum())
    c = a.copy()
    c[3] = np.nextafter(c[3], np.float32(np.inf)) if np.isfinite(c[3]) else np.float32(1.0)
    assert byte_mismatches(a, c) == 1
    assert byte_mismatches(a, a.astype(np.float64)) == 64


def test_quantized_preset_failure_names_its_criteria(tmp_path: Path, cli, rng: np.random.Generator) -> None:
    """A quantized preset is judged on the whole output (relative error, top-1): a failure says which numbers failed
    which bound, not the element-wise atol/rtol the preset turns off."""
    seed = int(rng.integers(1 << 30))
    model = _model(seed)
    w = numpy_helper.to_array(model.graph.initializer[1])
    noisy = onnx.ModelProto()
    noisy.CopyFrom(model)
    noisy.graph.initializer[1].CopyFrom(numpy_helper.from_array(
        (w * (1 + 0.5 * rng.standard_normal(w.shape))).astype(np.float32), "w"))
    onnx.save(model, tmp_path / "a.onnx")
    onnx.save(noisy, tmp_path / "b.onnx")
    res = cli("diff", tmp_path / "b.onnx", tmp_path / "a.onnx", "--precision", "int8",
              "--save", tmp_path / "r.json")
    assert_one_line_error(res, 1, "int8 preset", "relative error <= 0.1", "logits (relative error")
    assert "atol" not in res.err
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["precision"] == "int8" and not summary["passed"]
