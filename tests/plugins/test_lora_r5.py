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


def _conv1d_model(path: Path, rng: np.random.Generator) -> None:
    """GPT-2 style: x [batch, sequence, 16] -> Reshape [-1, 16] -> Gemm (Conv1D weight [16, 24], bias) -> Reshape."""
    h, o = 16, 24
    nodes = [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Reshape", ["x", "shp"], ["x2"]),
             helper.make_node("Gemm", ["x2", "m.c_attn.weight", "m.c_attn.bias"], ["y2"]),
             helper.make_node("Slice", ["xs", "st", "en"], ["lead"]),
             helper.make_node("Concat", ["lead", "o"], ["shp2"], axis=0),
             helper.make_node("Reshape", ["y2", "shp2"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((h, o)).astype(np.float32), "m.c_attn.weight"),
             numpy_helper.from_array(rng.standard_normal(o).astype(np.float32), "m.c_attn.bias"),
             *(numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
               (("shp", [-1, h]), ("st", [0]), ("en", [2]), ("o", [o])))]
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", h])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", o])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_packed_token_slot_ids_get_the_token_range_in_the_engine(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    # old: GPT-2 style x [batch, sequence, 16] -> Reshape [-1, 16] -> Gemm (Conv1D) gave lora_slot_ids the dim
    # shape inference made up ('unk__0'), which the build sized by position as a batch: the engine took 1..16 slot
    # ids while x takes up to 16 x 1024 tokens (no forward above 16 tokens could run); now 'lora_tokens', sized
    # batch x sequence, so the slot ids take every token count x does (real TensorRT-RTX build)
    import json

    from trtforge.profiles.loader import load_profile

    _conv1d_model(tmp_path / "m.onnx", rng)
    res = cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "l.onnx", "--targets", "c_attn",
              "--max-rank", "4", "--slots", "2")
    assert res.code == 0, res.err
    res = cli("build", tmp_path / "l.onnx", "--profile", "a100", "-o", tmp_path / "eng")
    assert res.code == 0, res.err
    inputs = {i["name"]: i for i in json.loads((tmp_path / "eng" / "manifest.json").read_text())["inputs"]}
    shapes = load_profile("a100").shapes
    got = [(p["min"], p["opt"], p["max"]) for p in inputs["lora_slot_ids"]["profiles"]]
    want = [([s.batch.min * s.sequence.min], [s.batch.opt * s.sequence.opt], [s.batch.max * s.sequence.max])
            for s in shapes]
    assert got == want
    assert [p["max"][0] * p["max"][1] for p in inputs["x"]["profiles"]] == [w[2][0] for w in want]


def test_pack_memory_limit_counts_reclaimable_page_cache(tmp_path: Path) -> None:
    # old: the pool's memory check used free memory only (sysconf SC_AVPHYS_PAGES = MemFree), so a machine whose
    # RAM held cached model files refused a pool of 2 GiB ('more than this machine's 1.0 GiB of free memory') with
    # 64 GiB available; now Linux's MemAvailable
    from trtforge.plugins.lora.pack import _memory_limit

    real = Path("/proc/meminfo")
    if real.is_file():  # this machine: within 2% of MemAvailable (the page cache moves a little between reads)
        lines = real.read_text().splitlines()
        avail = next(int(ln.split()[1]) * 1024 for ln in lines if ln.startswith("MemAvailable:"))
        assert abs(_memory_limit() - avail) < 0.02 * avail
    fake = tmp_path / "meminfo"
    fake.write_text("MemTotal:       134217728 kB\nMemFree:          1048576 kB\nMemAvailable:   67108864 kB\n")
    assert _memory_limit(fake) == 64 * 2**30


def test_diff_sizes_packed_token_slot_ids_as_the_tokens(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    # old: diff gave the 1-D lora_slot_ids the first-dim default size 2 while the 2-D projection input had 2 x 4
    # tokens: the decomposed model failed in onnxruntime's MatMul (exit 2, naming a deleted temporary), so a GPT-2
    # style LoRA model could not be diffed against its original at all; now it gets batch x sequence
    _conv1d_model(tmp_path / "m.onnx", rng)
    res = cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "l.onnx", "--targets", "c_attn",
              "--max-rank", "4", "--slots", "2")
    assert res.code == 0, res.err
    for shape in ([], ["--shape", "x:3,5,16"]):
        res = cli("diff", tmp_path / "l.onnx", tmp_path / "m.onnx", "--extra-inputs", "--value", "lora_slot_ids=-1",
                  *shape)
        assert res.code == 0, res.err
        assert "outputs match" in res.out


def test_tied_lm_head_is_adapted_as_lm_head(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    # old: an LM head tied to the embedding (MatMul of Transpose(model.embed_tokens.weight), node /lm_head/MatMul)
    # took the embedding's module path: --targets lm_head matched nothing ('projections found: embed_tokens') and
    # --targets embed_tokens added lora_a.model.embed_tokens, so PEFT's lm_head adapter could not be packed; now the
    # head is lm_head, and the packed adapter's decomposed output matches a float64 reference per token slot
    import json

    import onnxruntime as ort
    from safetensors.numpy import save_file

    from trtforge.plugins.lora.pack import read_safetensors

    v, h, r = 32, 16, 4
    emb = rng.standard_normal((v, h)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["model.embed_tokens.weight", "ids"], ["h"], name="/model/embed_tokens/Gather"),
             helper.make_node("Transpose", ["model.embed_tokens.weight"], ["wt"], perm=[1, 0], name="/lm_head/T"),
             helper.make_node("MatMul", ["h", "wt"], ["logits"], name="/lm_head/MatMul")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 3, v])],
                          [numpy_helper.from_array(emb, "model.embed_tokens.weight")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    res = cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "l.onnx", "--targets", "lm_head",
              "--max-rank", str(r), "--slots", "2")
    assert res.code == 0, res.err
    (tmp_path / "ad").mkdir()
    a, b = rng.standard_normal((r, h)).astype(np.float32), rng.standard_normal((v, r)).astype(np.float32)
    save_file({"base_model.model.lm_head.lora_A.weight": a, "base_model.model.lm_head.lora_B.weight": b},
              str(tmp_path / "ad" / "adapter_model.safetensors"))
    (tmp_path / "ad" / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": 8,
                                                                      "target_modules": ["lm_head"]}))
    res = cli("lora", "pack", tmp_path / "ad", "--model", tmp_path / "l.onnx", "-o", tmp_path / "pool.safetensors")
    assert res.code == 0, res.err
    assert cli("lora", "decompose", tmp_path / "l.onnx", "-o", tmp_path / "d.onnx").code == 0
    ids = rng.integers(0, v, (2, 3))
    slots = np.array([[0, -1, 1], [-1, 0, 0]], np.int32)  # slot 1 holds no adapter
    feeds = {"ids": ids, "lora_slot_ids": slots, **read_safetensors(tmp_path / "pool.safetensors")}
    (got,) = ort.InferenceSession(str(tmp_path / "d.onnx")).run(["logits"], feeds)
    x = emb.astype(np.float64)[ids]
    want = x @ emb.T.astype(np.float64) + (slots == 0)[..., None] * (8 / r) * (x @ a.T.astype(np.float64)) @ b.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
