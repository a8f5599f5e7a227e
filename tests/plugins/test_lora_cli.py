"""``trtforge lora inject | decompose | pack`` through the real CLI, with PEFT folders written in tmp_path."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtforge.plugins.lora import spec
from trtforge.plugins.lora.pack import read_safetensors
from trtforge_testing import assert_one_line_error

H = 256  # example model hidden size; v_proj out = 64


def _example(tmp_path: Path) -> Path:
    from trtforge.examples.llama import make_llama

    path = tmp_path / "model.onnx"
    onnx.save(make_llama(), path)
    return path


def _adapter(folder: Path, r: int, alpha: float, modules: dict[str, tuple[int, int]], *, rslora: bool = False,
             target_modules: list[str] | str | None = None, seed: int | None = None) -> dict[str, np.ndarray]:
    from safetensors.numpy import save_file

    g = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    tensors = {}
    for path, (h, o) in modules.items():
        tensors[f"base_model.model.{path}.lora_A.weight"] = g.standard_normal((r, h)).astype(np.float32)
        tensors[f"base_model.model.{path}.lora_B.weight"] = g.standard_normal((o, r)).astype(np.float32)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    cfg = {"r": r, "lora_alpha": alpha, "use_rslora": rslora, "peft_type": "LORA",
           "target_modules": target_modules or sorted({p.split(".")[-1] for p in modules})}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return tensors


def test_inject_decompose_cli(cli, tmp_path):
    model = _example(tmp_path)
    res = cli("lora", "inject", model, "-o", tmp_path / "lora.onnx", "--targets", "q_proj,v_proj", "--max-rank", "8",
              "--slots", "4")
    assert res.code == 0, res.err
    lora = onnx.load(tmp_path / "lora.onnx")
    assert sum(n.op_type == spec.PLUGIN_NAME for n in lora.graph.node) == 4
    res = cli("lora", "decompose", tmp_path / "lora.onnx", "-o", tmp_path / "ref.onnx")
    assert res.code == 0, res.err
    ref = onnx.load(tmp_path / "ref.onnx")
    onnx.checker.check_model(ref)
    assert not any(n.domain == spec.ONNX_DOMAIN for n in ref.graph.node)
    assert {i.name for i in ref.graph.input} == {i.name for i in lora.graph.input}


def test_inject_unknown_target_is_exit_2_naming_found(cli, tmp_path):
    model = _example(tmp_path)
    res = cli("lora", "inject", model, "-o", tmp_path / "x.onnx", "--targets", "qkv_proj")
    assert_one_line_error(res, 2, "qkv_proj", "q_proj", "v_proj", "down_proj")
    assert not (tmp_path / "x.onnx").exists()
    res = cli("lora", "inject", model, "-o", tmp_path / "x.onnx", "--targets", "q_proj", "--max-rank", "65")
    assert_one_line_error(res, 2, "max_rank")
    res = cli("lora", "decompose", model, "-o", tmp_path / "x.onnx")
    assert_one_line_error(res, 2, "no LoRAOpPluginDynamic")
    assert not (tmp_path / "x.onnx").exists()


def test_pack_against_injected_model(cli, tmp_path):
    model = _example(tmp_path)
    assert cli("lora", "inject", model, "-o", tmp_path / "lora.onnx", "--targets", "q_proj,v_proj",
               "--max-rank", "16", "--slots", "4").code == 0
    q0, v1 = "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.v_proj"
    a = _adapter(tmp_path / "a", 8, 16.0, {q0: (H, 256), v1: (H, 64)})
    b = _adapter(tmp_path / "b", 16, 8.0, {v1: (H, 64)}, rslora=True)
    res = cli("lora", "pack", tmp_path / "a", tmp_path / "b", "--model", tmp_path / "lora.onnx",
              "-o", tmp_path / "pool.safetensors")
    assert res.code == 0, res.err
    pool = read_safetensors(tmp_path / "pool.safetensors")
    graph = onnx.load(tmp_path / "lora.onnx").graph
    inputs = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    for name, t in pool.items():  # names and shapes are exactly the injected graph's inputs
        assert inputs[name] == list(t.shape), name
    assert set(pool) == {n for n in inputs if n.startswith(("lora_a.", "lora_b.", "lora_scales."))}
    qa, qb = pool[f"lora_a.{q0}"], pool[f"lora_b.{q0}"]
    np.testing.assert_array_equal(qa[0, :, :8], a[f"base_model.model.{q0}.lora_A.weight"].T)
    np.testing.assert_array_equal(qb[0, :8, :], a[f"base_model.model.{q0}.lora_B.weight"].T)
    assert not qa[0, :, 8:].any() and not qb[0, 8:].any() and not qa[1:].any()  # padding and empty slots
    np.testing.assert_array_equal(pool[f"lora_a.{v1}"][1], b[f"base_model.model.{v1}.lora_A.weight"].T)
    np.testing.assert_allclose(pool[f"lora_scales.{q0}"], [16 / 8, 0, 0, 0])
    np.testing.assert_allclose(pool[f"lora_scales.{v1}"], [16 / 8, 8 / math.sqrt(16), 0, 0], rtol=1e-6)
    # The same adapters give the same bytes (the library writes its metadata map in a random order; the header is
    # written with sorted keys), and the file is one the safetensors library itself reads back.
    for k in range(3):
        assert cli("lora", "pack", tmp_path / "a", tmp_path / "b", "--model", tmp_path / "lora.onnx",
                   "-o", tmp_path / f"again{k}.safetensors").code == 0
        assert (tmp_path / f"again{k}.safetensors").read_bytes() == (tmp_path / "pool.safetensors").read_bytes()
    from safetensors import safe_open

    with safe_open(str(tmp_path / "pool.safetensors"), "np") as fh:
        assert fh.metadata()["format"] == "trtforge-lora-pool-1"
        for name in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
            np.testing.assert_array_equal(fh.get_tensor(name), pool[name])


def test_pack_with_targets_and_errors(cli, tmp_path):
    q0 = "model.layers.0.self_attn.q_proj"
    _adapter(tmp_path / "ok", 4, 8.0, {q0: (32, 16)})
    res = cli("lora", "pack", tmp_path / "ok", "--targets", "q_proj", "--max-rank", "8", "--slots", "3",
              "--dtype", "float16", "-o", tmp_path / "pool.safetensors")
    assert res.code == 0, res.err
    pool = read_safetensors(tmp_path / "pool.safetensors")
    assert pool[f"lora_a.{q0}"].shape == (3, 32, 8) and pool[f"lora_a.{q0}"].dtype == np.float16
    assert cli("lora", "pack", tmp_path / "ok", "--dtype", "bfloat16", "-o", tmp_path / "bf.safetensors").code == 0
    bf = read_safetensors(tmp_path / "bf.safetensors")[f"lora_a.{q0}"]
    assert str(bf.dtype) == "bfloat16" and bf.shape == (1, 32, 4) and bf.astype(np.float32).any()
    # --dtype as precision --to / diff --precision / kv-plan --kv-dtype spell it (was a usage error): the same file
    assert cli("lora", "pack", tmp_path / "ok", "--dtype", "bf16", "-o", tmp_path / "bf2.safetensors").code == 0
    assert (tmp_path / "bf2.safetensors").read_bytes() == (tmp_path / "bf.safetensors").read_bytes()

    _adapter(tmp_path / "big", 32, 8.0, {q0: (32, 16)})
    res = cli("lora", "pack", tmp_path / "big", "--targets", "q_proj", "--max-rank", "16", "-o", tmp_path / "p2.st")
    assert_one_line_error(res, 2, str(tmp_path / "big"), "rank r=32", "max rank 16")
    assert not (tmp_path / "p2.st").exists()

    _adapter(tmp_path / "other", 4, 8.0, {"model.layers.0.mlp.up_proj": (32, 16)})
    res = cli("lora", "pack", tmp_path / "other", "--targets", "q_proj", "-o", tmp_path / "p3.st")
    assert_one_line_error(res, 2, str(tmp_path / "other"), "model.layers.0.mlp.up_proj.lora_A.weight")

    _adapter(tmp_path / "untargeted", 4, 8.0, {q0: (32, 16)}, target_modules=["v_proj"])
    res = cli("lora", "pack", tmp_path / "untargeted", "-o", tmp_path / "p4.st")
    assert_one_line_error(res, 2, str(tmp_path / "untargeted"), f"base_model.model.{q0}.lora_A.weight")

    _adapter(tmp_path / "wide", 4, 8.0, {q0: (48, 16)})
    res = cli("lora", "pack", tmp_path / "ok", tmp_path / "wide", "--targets", "q_proj", "-o", tmp_path / "p5.st")
    assert_one_line_error(res, 2, str(tmp_path / "wide"), f"base_model.model.{q0}.lora_A")

    bad = tmp_path / "badshape"
    tensors = _adapter(bad, 4, 8.0, {q0: (32, 16)})
    from safetensors.numpy import save_file

    tensors[f"base_model.model.{q0}.lora_B.weight"] = np.ones((16, 3), np.float32)
    save_file(tensors, str(bad / "adapter_model.safetensors"))
    res = cli("lora", "pack", bad, "-o", tmp_path / "p6.st")
    assert_one_line_error(res, 2, str(bad), f"base_model.model.{q0}.lora_A/B.weight")

    (tmp_path / "empty").mkdir()
    res = cli("lora", "pack", tmp_path / "empty", "-o", tmp_path / "p7.st")
    assert_one_line_error(res, 2, "adapter_config.json")
    assert not any(tmp_path.glob("p*.st"))


@pytest.mark.parametrize("argv", [["lora"], ["lora", "frobnicate"], ["lora", "inject", "x.onnx"]])
def test_usage_errors(cli, argv):
    assert_one_line_error(cli(*argv), 2)


@pytest.mark.parametrize("extra, why", [
    ({"use_dora": True}, "DoRA"), ({"bias": "lora_only"}, "bias"), ({"bias": "all"}, "bias"),
    ({"modules_to_save": ["classifier"]}, "modules_to_save")])
def test_pack_refuses_features_beyond_b_times_a(cli, tmp_path, extra, why):
    """PEFT features whose effect is more than scale * B @ A (vLLM's PEFTHelper refuses the same) exit 2."""
    q0 = "model.layers.0.self_attn.q_proj"
    _adapter(tmp_path / "ad", 4, 8.0, {q0: (32, 16)})
    cfg_path = tmp_path / "ad" / "adapter_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **extra}))
    res = cli("lora", "pack", tmp_path / "ad", "-o", tmp_path / "pool.st")
    assert_one_line_error(res, 2, "adapter_config.json", why)
    assert not (tmp_path / "pool.st").exists()


@pytest.mark.parametrize("key", ["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
                                 "base_model.model.model.layers.0.self_attn.q_proj.bias",
                                 "base_model.model.model.embed_tokens.lora_embedding_A"])
def test_pack_refuses_tensors_it_would_drop(cli, tmp_path, key, rng):
    """A weights-file tensor that is not a lora_A/B weight changes the adapter's outputs: exit 2 naming it, never a
    pool that silently leaves it out."""
    from safetensors.numpy import save_file

    q0 = "model.layers.0.self_attn.q_proj"
    tensors = _adapter(tmp_path / "ad", 4, 8.0, {q0: (32, 16)})
    tensors[key] = rng.standard_normal(16).astype(np.float32)
    save_file(tensors, str(tmp_path / "ad" / "adapter_model.safetensors"))
    res = cli("lora", "pack", tmp_path / "ad", "-o", tmp_path / "pool.st")
    assert_one_line_error(res, 2, key)
    assert not (tmp_path / "pool.st").exists()


def test_pack_follows_peft_target_regex_and_default_alpha(cli, tmp_path):
    """target_modules as a string is a regular expression over the whole module path (PEFT); a config without
    lora_alpha gets PEFT's default 8."""
    q0, up = "model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj"
    _adapter(tmp_path / "rx", 4, 8.0, {q0: (32, 16)}, target_modules=r".*\.self_attn\.(q|v)_proj")
    cfg_path = tmp_path / "rx" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["lora_alpha"]
    cfg_path.write_text(json.dumps(cfg))
    res = cli("lora", "pack", tmp_path / "rx", "-o", tmp_path / "pool.st")
    assert res.code == 0, res.err
    np.testing.assert_allclose(read_safetensors(tmp_path / "pool.st")[f"lora_scales.{q0}"], [8 / 4])
    _adapter(tmp_path / "miss", 4, 8.0, {up: (32, 16)}, target_modules=r".*\.self_attn\.(q|v)_proj")
    res = cli("lora", "pack", tmp_path / "miss", "-o", tmp_path / "p2.st")
    assert_one_line_error(res, 2, f"base_model.model.{up}.lora_A.weight", "target_modules")
    _adapter(tmp_path / "bad", 4, 8.0, {q0: (32, 16)}, target_modules="(q_proj")
    assert_one_line_error(cli("lora", "pack", tmp_path / "bad", "-o", tmp_path / "p3.st"), 2, "regular expression")


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_pack_names_an_adapter_file_that_is_not_a_file(cli, tmp_path, kind):
    _adapter(tmp_path / "a", 4, 8.0, {"model.layers.0.self_attn.q_proj": (H, 256)}, seed=1)
    cfg = tmp_path / "a" / "adapter_config.json"
    cfg.unlink()
    if kind == "folder":
        cfg.mkdir()
    else:
        os.mkfifo(cfg)
    res = cli("lora", "pack", tmp_path / "a", "-o", tmp_path / "pool.safetensors")
    assert_one_line_error(res, 2, "adapter_config.json is not a regular file")
    assert not (tmp_path / "pool.safetensors").exists()


def test_pack_names_a_bin_adapter_and_its_conversion(cli, tmp_path):
    """A PEFT folder saved with safe_serialization=False holds adapter_model.bin: the error says so and how to
    convert it (it said adapter_model.safetensors 'is missing', as if the folder were not an adapter)."""
    _adapter(tmp_path / "a", 4, 8.0, {"model.layers.0.self_attn.q_proj": (H, 256)}, seed=1)
    st = tmp_path / "a" / "adapter_model.safetensors"
    st.rename(tmp_path / "a" / "adapter_model.bin")
    res = cli("lora", "pack", tmp_path / "a", "-o", tmp_path / "pool.safetensors")
    assert_one_line_error(res, 2, "adapter_model.bin", "safe_serialization=False", "save_file(torch.load(")
    assert not (tmp_path / "pool.safetensors").exists()


@pytest.mark.parametrize("targets, ok", [(["q_proj"], True), (["self_attn.q_proj"], True), (["self_attn"], False),
                                         (["layers"], False)])
def test_pack_target_modules_list_is_peft_suffix_rule(cli, tmp_path, targets, ok):
    """A target_modules list matches as PEFT does: the module path equals a name or ends with ``.name``. A name of an
    enclosing module (``self_attn``, ``layers``) adapts no projection in PEFT, so a q_proj tensor under it is not
    targeted and is refused (it was accepted: any dotted component matched)."""
    q0 = "model.layers.0.self_attn.q_proj"
    _adapter(tmp_path / "a", 4, 8.0, {q0: (H, 256)}, target_modules=targets, seed=3)
    res = cli("lora", "pack", tmp_path / "a", "-o", tmp_path / "pool.safetensors")
    if ok:
        assert res.code == 0, res.err
    else:
        assert_one_line_error(res, 2, f"base_model.model.{q0}.lora_A.weight", "not in target_modules")
        assert not (tmp_path / "pool.safetensors").exists()
