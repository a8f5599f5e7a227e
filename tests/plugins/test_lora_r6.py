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


# --------------------------------------------------------------------------- pack: PEFT rank_pattern / alpha_pattern
Q0, Q1, V0 = "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj", "model.layers.0.self_attn.v_proj"


def _projections_model(path: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """x [T, H]: q_proj 0 a MatMul of a Transpose'd [O, H] weight, q_proj 1 a Gemm with transB, v_proj a MatMul."""
    w = {Q0: rng.standard_normal((OUT_F, H)), Q1: rng.standard_normal((OUT_F, H)), V0: rng.standard_normal((H, OUT_F))}
    nodes = [helper.make_node("Transpose", [f"{Q0}.weight"], ["wq0T"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wq0T"], ["q0"], name="/model/layers.0/self_attn/q_proj/MatMul"),
             helper.make_node("Gemm", ["x", f"{Q1}.weight"], ["q1"], transB=1, name="/model/layers.1/q/Gemm"),
             helper.make_node("MatMul", ["x", f"{V0}.weight"], ["v0"], name="/model/layers.0/self_attn/v_proj/MatMul")]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [7, H])],
                          [vi(n, TensorProto.FLOAT, [7, OUT_F]) for n in ("q0", "q1", "v0")],
                          [numpy_helper.from_array(v.astype(np.float32), f"{k}.weight") for k, v in w.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return {k: v.astype(np.float32).astype(np.float64) for k, v in w.items()}


def _save_st(tensors: dict[str, np.ndarray], kind: str, path: Path) -> None:
    """A safetensors file with every tensor stored as ``kind`` (F16 or BF16), written by the format's layout."""
    import json

    import ml_dtypes

    dt = ml_dtypes.bfloat16 if kind == "BF16" else np.float16
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        blob = t.astype(dt).tobytes()
        header[name] = {"dtype": kind, "shape": list(t.shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def _peft_adapter(folder: Path, rng: np.random.Generator, cfg: dict, ranks: dict[str, int], kind: str
                  ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A PEFT folder (keys with the ``.default`` adapter name) whose module ``p`` has rank ``ranks[p]``; returns the
    float64 A [r, H] and B [O, r] as stored."""
    import json

    import ml_dtypes

    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    dt = ml_dtypes.bfloat16 if kind == "BF16" else np.float16
    tensors, out = {}, {}
    for p, r in ranks.items():
        a, b = rng.standard_normal((r, H)) / np.sqrt(H), rng.standard_normal((OUT_F, r)) / np.sqrt(r)
        tensors[f"base_model.model.{p}.lora_A.default.weight"] = a
        tensors[f"base_model.model.{p}.lora_B.default.weight"] = b
        out[p] = (a.astype(dt).astype(np.float64), b.astype(dt).astype(np.float64))
    _save_st(tensors, kind, folder / "adapter_model.safetensors")
    return out


def test_pack_applies_peft_rank_and_alpha_patterns(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    # old: any non-empty rank_pattern / alpha_pattern was refused ("not supported"), though the injected graph has
    # a lora_scales input per module for exactly this; now each module gets its own rank and alpha, as PEFT's
    # get_pattern_key picks them (the first key, in file order, matching the path's end)
    import onnxruntime as ort

    w = _projections_model(tmp_path / "m.onnx", rng)
    assert cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "i.onnx", "--targets", "q_proj,v_proj",
               "--max-rank", "8", "--slots", "4").code == 0
    # adapter 0: r 4, layers.1's q_proj rank 2 (the first key wins over the later 'q_proj'), v_proj rank 6, alpha 3
    cfg0 = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "bias": "none", "use_dora": False,
            "rank_pattern": {"layers.1.self_attn.q_proj": 2, "q_proj": 4, "v_proj": 6},
            "alpha_pattern": {"v_proj": 3}, "modules_to_save": None}
    # adapter 1: rsLoRA, a regex target_modules, ranks 8 and 2 by pattern, alpha 16 for q_proj 0 only
    cfg1 = {"r": 8, "lora_alpha": 4, "use_rslora": True, "target_modules": r".*\.(q|v)_proj",
            "rank_pattern": {"v_proj": 2}, "alpha_pattern": {r"layers\.0\.self_attn\.q_proj": 16}}
    want = [{Q0: (4, 8.0 / 4), Q1: (2, 8.0 / 2), V0: (6, 3.0 / 6)},
            {Q0: (8, 16.0 / np.sqrt(8)), Q1: (8, 4.0 / np.sqrt(8)), V0: (2, 4.0 / np.sqrt(2))}]
    ads = [_peft_adapter(tmp_path / f"a{k}", rng, cfg, {p: r for p, (r, _) in want[k].items()}, kind)
           for k, (cfg, kind) in enumerate([(cfg0, "F16"), (cfg1, "BF16")])]
    res = cli("lora", "pack", tmp_path / "a0", tmp_path / "a1", "--model", tmp_path / "i.onnx",
              "-o", tmp_path / "pool.safetensors")
    assert res.code == 0, res.err
    assert cli("lora", "decompose", tmp_path / "i.onnx", "-o", tmp_path / "d.onnx").code == 0
    from safetensors.numpy import load_file

    x = rng.standard_normal((7, H)).astype(np.float32)
    ids = np.array([0, 1, -1, 3, 1, 0, 2], np.int32)  # slots 2 and 3 hold no adapter: scale 0, zeros
    sess = ort.InferenceSession(str(tmp_path / "d.onnx"))
    got = dict(zip([o.name for o in sess.get_outputs()],
                   sess.run(None, {"x": x, "lora_slot_ids": ids, **load_file(str(tmp_path / "pool.safetensors"))}),
                   strict=True))
    xx = x.astype(np.float64)
    for name, p in (("q0", Q0), ("q1", Q1), ("v0", V0)):
        ref = xx @ (w[p] if p == V0 else w[p].T)
        for t, s in enumerate(ids):
            if s in (0, 1):
                a, b = ads[s][p]
                ref[t] += want[s][p][1] * (b @ (a @ xx[t]))
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(ref))), err_msg=name)


@pytest.mark.parametrize(("extra", "needle"), [
    ({"rank_pattern": {"q_proj": 0}}, "rank_pattern['q_proj'] is 0"),
    ({"rank_pattern": {"q_proj": 2.5}}, "rank_pattern['q_proj'] is 2.5"),
    ({"alpha_pattern": {"q_proj": "8"}}, "alpha_pattern['q_proj'] is '8'"),
    ({"rank_pattern": ["q_proj"]}, "'rank_pattern' is ['q_proj']"),
    ({"alpha_pattern": {"q_proj(": 8}}, "alpha_pattern key 'q_proj('"),
    ({"rank_pattern": {"q_proj": 2}}, "with r = 2 (from rank_pattern)"),  # the weights are rank 4
])
def test_pack_refuses_a_pattern_it_cannot_apply(cli, tmp_path: Path, rng: np.random.Generator, extra: dict,
                                                 needle: str) -> None:
    _peft_adapter(tmp_path / "a", rng, {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], **extra},
                  {Q0: 4}, "F16")
    res = cli("lora", "pack", tmp_path / "a", "-o", tmp_path / "pool.safetensors")
    assert_one_line_error(res, 2, str(tmp_path / "a"), needle)
    assert not (tmp_path / "pool.safetensors").exists()


@pytest.mark.parametrize(("pattern", "worst", "rank"), [({}, Q0, 8), ({"v_proj": 12}, V0, 12)])
def test_pack_names_the_module_whose_rank_is_above_the_max(cli, tmp_path: Path, rng: np.random.Generator,
                                                           pattern: dict, worst: str, rank: int) -> None:
    # old: a rank_pattern adapter was refused outright; the message now names the module and its rank
    ranks = {Q0: 8, V0: pattern.get("v_proj", 8)}
    _peft_adapter(tmp_path / "a", rng, {"r": 8, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"],
                                        "rank_pattern": pattern}, ranks, "BF16")
    res = cli("lora", "pack", tmp_path / "a", "-o", tmp_path / "pool.safetensors", "--max-rank", "4")
    assert_one_line_error(res, 2, f"module {worst!r} has rank r={rank}, above the max rank 4", f"--max-rank {rank}")


def test_unmatched_target_lists_names_that_are_targets(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    # old: 'projections found: 1, q_proj' for modules model.dense.1 and ...q_proj; '1' as a target would match
    # every module of layer 1, not dense.1; the list now names each module from its last non-numeric part
    vi = helper.make_tensor_value_info
    w1 = numpy_helper.from_array(rng.standard_normal((H, OUT_F)).astype(np.float32), "onnx::MatMul_42")
    w2 = numpy_helper.from_array(rng.standard_normal((H, OUT_F)).astype(np.float32), "model.dense.1.weight")
    g = helper.make_graph([helper.make_node("MatMul", ["x", w1.name], ["a"], name="/model/layers.0/attn/q_proj/MatMul"),
                           helper.make_node("MatMul", ["x", w2.name], ["b"], name="dense_mm")], "g",
                          [vi("x", TensorProto.FLOAT, ["batch", H])],
                          [vi("a", TensorProto.FLOAT, ["batch", OUT_F]), vi("b", TensorProto.FLOAT, ["batch", OUT_F])],
                          [w1, w2])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    res = cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--targets", "k_proj")
    assert_one_line_error(res, 2, "'k_proj'", "projections found: dense.1, q_proj")
    for name in ("dense.1", "q_proj"):  # each listed name is a target that injects exactly its module
        res = cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / f"{name}.onnx", "--targets", name)
        assert res.code == 0, res.err
        assert "1 LoRAOpPluginDynamic node(s)" in res.out
