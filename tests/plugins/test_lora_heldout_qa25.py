"""Held-out LoRA inputs (QA session 25): one module applied twice (two MatMuls of one weight), inject run a second
time with other targets, and PEFT weight files with two adapter names, integer/fp8 weights or data that does not
match its header. Each was wrong before: "inject once" for a model never injected, a model with two
``lora_slot_ids`` graph inputs (onnx's checker refuses it), one of two adapters packed silently, and "not a readable
safetensors file" without the tensor's name."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from trtforge.build_engine.core.errors import InputError
from trtforge.plugins.lora import spec
from trtforge.plugins.lora.decompose import decompose
from trtforge.plugins.lora.inject import inject
from trtforge_testing import assert_one_line_error

H, OUT_F, R, N = 8, 6, 3, 3
Q = "m.q_proj"


def _model(rng: np.random.Generator, shared: bool) -> onnx.ModelProto:
    """q_proj applied to x and x2 (shared=True: one weight, two MatMuls), or q_proj on x and v_proj on x."""
    vi = h.make_tensor_value_info
    inits = [nh.from_array(rng.standard_normal((H, OUT_F)).astype(np.float32), f"{Q}.weight"),
             nh.from_array(rng.standard_normal((H, OUT_F)).astype(np.float32), "m.v_proj.weight")]
    second = ("x2", f"{Q}.weight") if shared else ("x", "m.v_proj.weight")
    nodes = [h.make_node("MatMul", ["x", f"{Q}.weight"], ["q"], name="/m/q_proj/MatMul"),
             h.make_node("MatMul", list(second), ["q2"], name="/m/q_proj/MatMul_1" if shared else "/m/v_proj/MatMul")]
    graph = h.make_graph(nodes, "g", [vi("x", T.FLOAT, ["b", "s", H]), vi("x2", T.FLOAT, ["b", "s", H])],
                         [vi("q", T.FLOAT, ["b", "s", OUT_F]), vi("q2", T.FLOAT, ["b", "s", OUT_F])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _pool(rng: np.random.Generator, path: str) -> dict[str, np.ndarray]:
    return {f"lora_a.{path}": rng.standard_normal((N, H, R)).astype(np.float32),
            f"lora_b.{path}": rng.standard_normal((N, R, OUT_F)).astype(np.float32),
            f"lora_scales.{path}": rng.uniform(0.5, 2.0, N).astype(np.float32)}


def test_module_applied_twice_shares_one_pool(rng: np.random.Generator) -> None:
    src = _model(rng, shared=True)
    lora = inject(src, ["q_proj"], R, N)
    onnx.checker.check_model(lora, full_check=True)
    nodes = [n for n in lora.graph.node if spec.is_lora_node(n)]
    assert len(nodes) == 2 and len({n.name for n in nodes}) == 2
    assert {n.input[spec.LORA_A] for n in nodes} == {f"lora_a.{Q}"}  # one module, one pool
    assert sum(i.name.startswith("lora_a.") for i in lora.graph.input) == 1
    x, x2 = (rng.standard_normal((2, 4, H)).astype(np.float32) for _ in range(2))
    ids = rng.integers(-1, N, size=(2, 4)).astype(np.int32)
    ids[0, 0], ids[1, 3] = -1, N - 1
    feeds = {"x": x, "x2": x2, spec.SLOT_IDS_INPUT: ids, **_pool(rng, Q)}
    dec = ReferenceEvaluator(decompose(lora))
    got = dec.run(None, feeds)
    w = nh.to_array(src.graph.initializer[0]).astype(np.float64)
    a, b, sc = (feeds[f"{k}.{Q}"].astype(np.float64) for k in ("lora_a", "lora_b", "lora_scales"))
    for xin, out in zip((x, x2), got, strict=True):
        want = xin.astype(np.float64) @ w
        for idx in np.ndindex(2, 4):
            if ids[idx] >= 0:
                want[idx] += sc[ids[idx]] * (xin[idx].astype(np.float64) @ a[ids[idx]] @ b[ids[idx]])
        assert np.max(np.abs(out - want)) <= 1e-4 * max(1.0, float(np.max(np.abs(want))))
    off = dec.run(None, {**feeds, spec.SLOT_IDS_INPUT: np.full((2, 4), -1, np.int32)})
    base = ReferenceEvaluator(src).run(None, {"x": x, "x2": x2})
    assert all(o.tobytes() == s.tobytes() for o, s in zip(off, base, strict=True))


def test_inject_again_with_other_targets_shares_slot_ids(rng: np.random.Generator) -> None:
    src = _model(rng, shared=False)
    once = inject(src, ["q_proj"], R, N)
    twice = inject(once, ["v_proj"], R, N)
    onnx.checker.check_model(twice, full_check=True)
    at_once = inject(src, ["q_proj", "v_proj"], R, N)
    assert [i.name for i in twice.graph.input] == [i.name for i in at_once.graph.input]
    assert [i.name for i in twice.graph.input].count(spec.SLOT_IDS_INPUT) == 1
    feeds = {"x": rng.standard_normal((2, 3, H)).astype(np.float32), "x2": np.zeros((2, 3, H), np.float32),
             spec.SLOT_IDS_INPUT: rng.integers(-1, N, size=(2, 3)).astype(np.int32),
             **_pool(rng, Q), **_pool(rng, "m.v_proj")}
    got = ReferenceEvaluator(decompose(twice)).run(None, feeds)
    want = ReferenceEvaluator(decompose(at_once)).run(None, feeds)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    for args, kw, needle in ((("v_proj", R + 1, N), {}, "--max-rank 3 --slots 3"),
                             (("v_proj", R, N + 1), {}, "--max-rank 3 --slots 3"),
                             (("v_proj", R, N), {"per_sequence": True}, "slot layout")):
        with pytest.raises(InputError, match=needle):
            inject(once, [args[0]], args[1], args[2], **kw)
    with pytest.raises(InputError, match="already has a"):
        inject(once, ["q_proj"], R, N)
    stray = onnx.ModelProto()
    stray.CopyFrom(src)
    stray.graph.input.append(h.make_tensor_value_info(spec.SLOT_IDS_INPUT, T.INT32, ["b", "s"]))
    with pytest.raises(InputError, match="no LoRAOpPluginDynamic nodes"):
        inject(stray, ["q_proj"], R, N)


def _raw_safetensors(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    header, body = {}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + len(data)]}
        body += data
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def _adapter(folder: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> Path:
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(_raw_safetensors(tensors))
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}))
    return folder


def _f32(rng: np.random.Generator, shape: list[int]) -> tuple[str, list[int], bytes]:
    return "F32", shape, rng.standard_normal(shape).astype(np.float32).tobytes()


@pytest.mark.parametrize("names", [("default", "other"), ("", "default")])
def test_pack_refuses_two_weights_of_one_module(cli, tmp_path: Path, rng: np.random.Generator,
                                                names: tuple[str, str]) -> None:
    keys = {}
    for name in names:
        mid = f".{name}" if name else ""
        keys[f"base_model.model.{Q}.lora_A{mid}.weight"] = _f32(rng, [4, H])
        keys[f"base_model.model.{Q}.lora_B{mid}.weight"] = _f32(rng, [OUT_F, 4])
    folder = _adapter(tmp_path / "ad", keys)
    res = cli("lora", "pack", folder, "--targets", "q_proj", "-o", tmp_path / "pool.st")
    a_keys = [k for k in keys if ".lora_A" in k]
    assert_one_line_error(res, 2, str(folder / "adapter_model.safetensors"), *a_keys, "one adapter per folder")
    assert not (tmp_path / "pool.st").exists()


@pytest.mark.parametrize("kind", ["I32", "F8_E4M3", "short"])
def test_pack_names_the_tensor_it_cannot_read(cli, tmp_path: Path, rng: np.random.Generator, kind: str) -> None:
    a_key, b_key = f"base_model.model.{Q}.lora_A.weight", f"base_model.model.{Q}.lora_B.weight"
    if kind == "I32":
        a = ("I32", [4, H], np.ones((4, H), np.int32).tobytes())
    elif kind == "F8_E4M3":
        a = ("F8_E4M3", [4, H], np.ones((4, H)).astype(ml_dtypes.float8_e4m3fn).tobytes())
    else:  # the header says [4, H] floats; the data holds one row fewer
        a = ("F32", [4, H], np.ones((3, H), np.float32).tobytes())
    folder = _adapter(tmp_path / "ad", {a_key: a, b_key: _f32(rng, [OUT_F, 4])})
    res = cli("lora", "pack", folder, "--targets", "q_proj", "-o", tmp_path / "pool.st")
    needle = "does not match its header" if kind == "short" else f"dtype '{kind}'"
    assert_one_line_error(res, 2, str(folder / "adapter_model.safetensors"), a_key, needle)
    assert not (tmp_path / "pool.st").exists()


@pytest.mark.parametrize("enc_seq", [7, 1])
def test_targets_of_different_static_sequence_lengths_are_refused(rng: np.random.Generator, enc_seq: int) -> None:
    """q_proj on decoder states [2, 5, H], v_proj on encoder states [2, enc_seq, H]: one per-token lora_slot_ids
    [2, 5] cannot serve both (with enc_seq 1 the decomposed graph broadcast v's output to [2, 5, O]); per sequence,
    slot_ids [2] can."""
    vi = h.make_tensor_value_info
    inits = [nh.from_array(rng.standard_normal((H, OUT_F)).astype(np.float32), f"d.{p}.weight")
             for p in ("q_proj", "v_proj")]
    nodes = [h.make_node("MatMul", ["dec", "d.q_proj.weight"], ["q"]),
             h.make_node("MatMul", ["enc", "d.v_proj.weight"], ["v"])]
    graph = h.make_graph(nodes, "g", [vi("dec", T.FLOAT, [2, 5, H]), vi("enc", T.FLOAT, [2, enc_seq, H])],
                         [vi("q", T.FLOAT, [2, 5, OUT_F]), vi("v", T.FLOAT, [2, enc_seq, OUT_F])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(InputError, match=f"different static sizes at dim 1 .*d.v_proj: {enc_seq}.*--per-sequence"):
        inject(model, ["q_proj", "v_proj"], R, N)
    per_seq = inject(model, ["q_proj", "v_proj"], R, N, per_sequence=True)
    onnx.checker.check_model(per_seq, full_check=True)
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    wide.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 3
    with pytest.raises(InputError, match="dim 0"):
        inject(wide, ["q_proj", "v_proj"], R, N, per_sequence=True)


def test_decompose_refuses_a_plugin_node_it_cannot_lower(cli, tmp_path: Path) -> None:
    """A plugin node inside an If branch: decompose lowers the main graph only, so it must refuse (exit 2, no output)
    rather than write a model it says holds only standard ops (onnxruntime then failed to load it)."""
    vi = h.make_tensor_value_info
    node = h.make_node(spec.PLUGIN_NAME, ["x", "y", "a", "b", "ids", "sc"], ["t_out"], domain=spec.ONNX_DOMAIN,
                       max_rank=R, num_slots=N, in_features=H, out_features=OUT_F)
    then_g = h.make_graph([node], "then", [], [vi("t_out", T.FLOAT, [5, OUT_F])])
    else_g = h.make_graph([h.make_node("Identity", ["y"], ["e_out"])], "else", [], [vi("e_out", T.FLOAT, [5, OUT_F])])
    inputs = [vi("c", T.BOOL, []), vi("x", T.FLOAT, [5, H]), vi("y", T.FLOAT, [5, OUT_F]),
              vi("a", T.FLOAT, [N, H, R]), vi("b", T.FLOAT, [N, R, OUT_F]), vi("ids", T.INT32, [5]),
              vi("sc", T.FLOAT, [N])]
    graph = h.make_graph([h.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)], "g", inputs,
                         [vi("out", T.FLOAT, [5, OUT_F])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(spec.ONNX_DOMAIN, 1)])
    onnx.save(model, tmp_path / "if.onnx")
    res = cli("lora", "decompose", tmp_path / "if.onnx", "-o", tmp_path / "d.onnx")
    assert_one_line_error(res, 2, str(tmp_path / "if.onnx"), "If/Loop/Scan body", "main graph")
    assert not (tmp_path / "d.onnx").exists()


def test_pack_with_model_keeps_each_modules_dtype(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    """An fp16 q_proj beside an fp32 v_proj (an autocast export): the injected model declares fp16 and fp32 pools,
    and pack --model must write each in its module's dtype (it wrote all of them float32, which onnxruntime refused
    for q_proj); a model whose LoRA inputs differ in [slots, rank] is refused by name."""
    import onnxruntime as ort
    from safetensors.numpy import save_file

    from trtforge.plugins.lora.pack import read_safetensors

    vi = h.make_tensor_value_info
    nodes = [h.make_node("Cast", ["x"], ["x16"], to=T.FLOAT16),
             h.make_node("MatMul", ["x16", "m.q_proj.weight"], ["q"], name="/m/q_proj/MatMul"),
             h.make_node("Cast", ["q"], ["q32"], to=T.FLOAT),
             h.make_node("MatMul", ["q32", "m.v_proj.weight"], ["v"], name="/m/v_proj/MatMul")]
    inits = [nh.from_array(rng.standard_normal((H, H)).astype(np.float16), "m.q_proj.weight"),
             nh.from_array(rng.standard_normal((H, OUT_F)).astype(np.float32), "m.v_proj.weight")]
    graph = h.make_graph(nodes, "g", [vi("x", T.FLOAT, ["t", H])], [vi("v", T.FLOAT, ["t", OUT_F])], inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "m.onnx")
    assert cli("lora", "inject", tmp_path / "m.onnx", "-o", tmp_path / "l.onnx", "--targets", "q_proj,v_proj",
               "--max-rank", str(R), "--slots", str(N)).code == 0
    folder = tmp_path / "ad"
    folder.mkdir()
    save_file({f"base_model.model.m.{p}.lora_{ab}.weight": rng.standard_normal(shape).astype(np.float32)
               for p, o in (("q_proj", H), ("v_proj", OUT_F)) for ab, shape in (("A", (R, H)), ("B", (o, R)))},
              str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": R, "lora_alpha": 8, "target_modules": ["q_proj",
                                                                                                          "v_proj"]}))
    res = cli("lora", "pack", folder, "--model", tmp_path / "l.onnx", "-o", tmp_path / "pool.st")
    assert res.code == 0, res.err
    pool = read_safetensors(tmp_path / "pool.st")
    assert {k: str(v.dtype) for k, v in pool.items() if not k.startswith("lora_scales")} == {
        "lora_a.m.q_proj": "float16", "lora_b.m.q_proj": "float16",
        "lora_a.m.v_proj": "float32", "lora_b.m.v_proj": "float32"}
    assert cli("lora", "decompose", tmp_path / "l.onnx", "-o", tmp_path / "d.onnx").code == 0
    feeds = {"x": rng.standard_normal((5, H)).astype(np.float32), spec.SLOT_IDS_INPUT: np.array([0, -1, 0, 1, 2],
                                                                                                 np.int32), **pool}
    (out,) = ort.InferenceSession(str(tmp_path / "d.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert out.shape == (5, OUT_F) and np.isfinite(out).all()
    res = cli("lora", "pack", folder, "--model", tmp_path / "l.onnx", "--dtype", "float16", "-o", tmp_path / "p2.st")
    assert_one_line_error(res, 2, "float16,float32")

    lora = onnx.load(tmp_path / "l.onnx")  # one module re-declared with other slots: not one pool layout
    for vi_ in lora.graph.input:
        if vi_.name in ("lora_a.m.v_proj", "lora_b.m.v_proj"):
            vi_.type.tensor_type.shape.dim[0].dim_value = N + 1
    onnx.save(lora, tmp_path / "odd.onnx")
    res = cli("lora", "pack", folder, "--model", tmp_path / "odd.onnx", "-o", tmp_path / "p3.st")
    assert_one_line_error(res, 2, str(tmp_path / "odd.onnx"), "lora_a.m.v_proj", "[slots, rank]")
    assert not (tmp_path / "p2.st").exists() and not (tmp_path / "p3.st").exists()


@pytest.mark.parametrize(("value", "dtype", "ok"), [(np.nan, "float32", False), (np.inf, "bfloat16", False),
                                                    (1e5, "float16", False), (1e5, "bfloat16", True)])
def test_pack_refuses_weights_that_are_not_finite_in_the_pool(cli, tmp_path: Path, rng: np.random.Generator,
                                                              value: float, dtype: str, ok: bool) -> None:
    """A NaN/inf adapter weight, or one fp16 cannot hold (it became inf), made every output of its slot NaN/inf."""
    a = rng.standard_normal((4, H)).astype(np.float32)
    a[1, 2] = value
    a_key = f"base_model.model.{Q}.lora_A.weight"
    folder = _adapter(tmp_path / "ad", {a_key: ("F32", [4, H], a.tobytes()),
                                        f"base_model.model.{Q}.lora_B.weight": _f32(rng, [OUT_F, 4])})
    res = cli("lora", "pack", folder, "--targets", "q_proj", "--dtype", dtype, "-o", tmp_path / "pool.st")
    if ok:
        assert res.code == 0, res.err
        from trtforge.plugins.lora.pack import read_safetensors

        assert np.isfinite(read_safetensors(tmp_path / "pool.st")[f"lora_a.{Q}"].astype(np.float32)).all()
    else:
        assert_one_line_error(res, 2, str(folder), a_key, "NaN/inf")
        assert not (tmp_path / "pool.st").exists()


def _chain(dtype: int = T.FLOAT) -> onnx.ModelProto:
    """q_proj applied to x and x2 (one weight), their sum into v_proj: v_proj's input lies downstream of q_proj's
    plugin nodes once q_proj is injected; no value_info, so only shape inference can tell its rank."""
    g = np.random.default_rng(25)
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    vi = h.make_tensor_value_info
    inits = [nh.from_array(g.standard_normal((H, OUT_F)).astype(np_type), f"{Q}.weight"),
             nh.from_array(g.standard_normal((OUT_F, OUT_F)).astype(np_type), "m.v_proj.weight")]
    nodes = [h.make_node("MatMul", ["x", f"{Q}.weight"], ["q1"], name="/m/q_proj/MatMul"),
             h.make_node("MatMul", ["x2", f"{Q}.weight"], ["q2"], name="/m/q_proj/MatMul_1"),
             h.make_node("Add", ["q1", "q2"], ["s"]),
             h.make_node("MatMul", ["s", "m.v_proj.weight"], ["v"], name="/m/v_proj/MatMul")]
    graph = h.make_graph(nodes, "g", [vi("x", dtype, ["b", "s", H]), vi("x2", dtype, ["b", "s", H])],
                         [vi("v", dtype, ["b", "s", OUT_F])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_inject_again_downstream_of_a_plugin_node() -> None:
    """Shape inference stopped at plugin nodes: the second inject said v_proj's input 's' had an unknown rank."""
    src = _chain()
    twice = inject(inject(src, ["q_proj"], R, N), ["v_proj"], R, N)
    onnx.checker.check_model(twice, full_check=True)
    at_once = inject(src, ["q_proj", "v_proj"], R, N)
    assert [i.name for i in twice.graph.input] == [i.name for i in at_once.graph.input]
    assert sum(spec.is_lora_node(n) for n in twice.graph.node) == 3


def test_engine_builds_bf16_shared_pool_per_sequence(tmp_path: Path) -> None:
    """One TensorRT-RTX build (SM 8.0): a bf16 model injected twice, per sequence, with a module applied twice."""
    pytest.importorskip("tensorrt_rtx")
    from trtforge.build_engine.engine.backend import prepare_plugin_loading, rtx_compute_capability_enum, select_backend
    from trtforge.plugins import register_all

    model = inject(inject(_chain(T.BFLOAT16), ["q_proj"], R, N, per_sequence=True), ["v_proj"], R, N,
                   per_sequence=True)
    backend = select_backend("tensorrt-rtx")
    prepare_plugin_loading(backend)
    rtx = backend.module
    register_all(rtx)
    logger = rtx.Logger(rtx.Logger.ERROR)
    builder = rtx.Builder(logger)
    network = builder.create_network(0)
    parser = rtx.OnnxParser(network, logger)
    onnx.save(model, tmp_path / "m.onnx")
    assert parser.parse_from_file(str(tmp_path / "m.onnx")), [parser.get_error(i).desc()
                                                              for i in range(parser.num_errors)]
    plugins = [network.get_layer(i) for i in range(network.num_layers)
               if network.get_layer(i).type == rtx.LayerType.PLUGIN_V3]
    assert len(plugins) == 3 and all(p.get_output(0).dtype == rtx.bfloat16 for p in plugins)
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(rtx_compute_capability_enum(rtx, "8.0"), 0)
    profile = builder.create_optimization_profile()
    for name in ("x", "x2"):
        profile.set_shape(name, (1, 1, H), (2, 4, H), (4, 16, H))
    profile.set_shape(spec.SLOT_IDS_INPUT, (1,), (2,), (4,))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None and spec.PLUGIN_NAME.encode() in bytes(plan)


def test_decompose_plugin_nodes_that_share_a_node_name(rng: np.random.Generator) -> None:
    """ONNX node names need not be unique; two plugin nodes both named 'lora' made decompose write one value name
    twice (onnx's checker: not SSA; the CLI exited 3, 'internal error')."""
    vi = h.make_tensor_value_info
    inputs = [vi("x", T.FLOAT, [5, H]), vi("y", T.FLOAT, [5, H]), vi("a", T.FLOAT, [N, H, R]),
              vi("b", T.FLOAT, [N, R, H]), vi("ids", T.INT32, [5]), vi("sc", T.FLOAT, [N])]
    nodes = [h.make_node(spec.PLUGIN_NAME, [x, "y", "a", "b", "ids", "sc"], [o], name="lora", domain=spec.ONNX_DOMAIN,
                         max_rank=R, num_slots=N, in_features=H, out_features=H)
             for x, o in (("x", "o1"), ("o1", "o2"))]
    graph = h.make_graph(nodes, "g", inputs, [vi("o2", T.FLOAT, [5, H])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(spec.ONNX_DOMAIN, 1)])
    dec = decompose(model)
    onnx.checker.check_model(dec, full_check=True)
    f = {"x": rng.standard_normal((5, H)).astype(np.float32), "y": rng.standard_normal((5, H)).astype(np.float32),
         "a": rng.standard_normal((N, H, R)).astype(np.float32), "b": rng.standard_normal((N, R, H)).astype(np.float32),
         "ids": np.array([0, -1, 1, 2, 0], np.int32), "sc": rng.uniform(0.5, 2.0, N).astype(np.float32)}
    from trtforge.plugins.lora.reference import lora_op

    want = lora_op(lora_op(f["x"], f["y"], f["a"], f["b"], f["ids"], f["sc"]), f["y"], f["a"], f["b"], f["ids"],
                   f["sc"])
    (got,) = ReferenceEvaluator(dec).run(None, f)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flag", ["false", 0, "true"])
def test_pack_refuses_a_use_rslora_that_is_not_a_boolean(cli, tmp_path: Path, rng: np.random.Generator,
                                                          flag: object) -> None:
    """bool("false") is True: a string use_rslora silently switched the scale to alpha / sqrt(r)."""
    folder = _adapter(tmp_path / "ad", {f"base_model.model.{Q}.lora_A.weight": _f32(rng, [4, H]),
                                        f"base_model.model.{Q}.lora_B.weight": _f32(rng, [OUT_F, 4])})
    cfg = folder / "adapter_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "use_rslora": flag}))
    res = cli("lora", "pack", folder, "-o", tmp_path / "pool.st")
    assert_one_line_error(res, 2, str(cfg), "use_rslora")
    assert not (tmp_path / "pool.st").exists()
