"""trtforge diff --save, and every JSON report writer: non-finite numbers are written as the strings "inf", "-inf"
and "nan" (standard JSON has no such numbers), never as null and never as bare Infinity / NaN tokens."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.build_engine.core import fsutil, jsonout
from trtforge.build_engine.verify.diff import run_diff

H = 6


def _strict(text: str) -> Any:
    def refuse(token: str) -> None:
        raise AssertionError(f"bare JSON constant {token}")

    return json.loads(text, parse_constant=refuse)


def _number(v: Any) -> float:
    assert v is not None, "a number was saved as null"
    return float(v)  # "inf" / "-inf" / "nan" read back with float()


def _models(tmp: Path, rng: np.random.Generator) -> tuple[Path, Path]:
    """A (candidate) and B (reference) with outputs: ``zero_ref`` (B is x - x = 0, A is x * w, nonzero: relative
    error inf), ``overflow`` (A is x / (x - x) = +-inf, B is x: max abs inf) and ``nan`` (A is 0 / 0, B is x)."""
    w = numpy_helper.from_array(rng.uniform(0.5, 2.0, H).astype(np.float32), "w")
    a_nodes = [helper.make_node("Mul", ["x", "w"], ["zero_ref"]), helper.make_node("Sub", ["x", "x"], ["z"]),
               helper.make_node("Div", ["x", "z"], ["overflow"]), helper.make_node("Div", ["z", "z"], ["nan"])]
    b_nodes = [helper.make_node("Sub", ["x", "x"], ["zero_ref"]), helper.make_node("Identity", ["x"], ["overflow"]),
               helper.make_node("Identity", ["x"], ["nan"])]
    paths = []
    for tag, nodes, inits in (("a", a_nodes, [w]), ("b", b_nodes, [])):
        g = helper.make_graph(nodes, tag, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, H])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, H])
                               for n in ("zero_ref", "overflow", "nan")], initializer=inits)
        p = tmp / f"{tag}.onnx"
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), p)
        paths.append(p)
    return paths[0], paths[1]


def test_diff_save_keeps_infinite_and_nan_errors(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    # old: R.summary.json wrote rel_error / rel_to_scale inf (reference 0, actual nonzero) and max_abs inf as null,
    # and R.accuracy.json (Polygraphy's save) held bare Infinity / NaN tokens, which standard JSON readers refuse
    from polygraphy.comparator.struct import AccuracyResults

    a, b = _models(tmp_path, rng)
    seed = int(rng.integers(0, 1 << 16))
    res = cli("diff", a, b, "--seed", seed, "--save", tmp_path / "r.json")
    assert res.code == 1, res.err
    texts = {p: (tmp_path / p).read_text() for p in ("r.json", "r.accuracy.json", "r.summary.json")}
    saved = {p: _strict(t) for p, t in texts.items()}
    want = {o.name: o for o in run_diff(a, b, seed=seed).outputs}
    rows = {o["name"]: o for o in saved["r.summary.json"]["outputs"]}
    assert want["zero_ref"].rel_error == math.inf and want["overflow"].max_abs == math.inf  # the cases at stake
    for name, o in want.items():
        for key in ("max_abs", "max_rel", "rel_to_scale", "rel_error"):
            got, expected = _number(rows[name][key]), getattr(o, key)
            assert got == expected or (math.isnan(got) and math.isnan(expected)), (name, key, got, expected)
    acc = AccuracyResults.load(str(tmp_path / "r.accuracy.json"))  # Polygraphy still reads its file
    result = acc[0][next(iter(acc[0]))][0]
    assert _number(result["overflow"].max_absdiff) == math.inf and math.isnan(_number(result["nan"].max_absdiff))


@pytest.mark.parametrize("writer", ["write_json", "staged_json", "dumps"])
def test_report_writers_keep_non_finite_numbers(writer: str, tmp_path: Path, rng: np.random.Generator) -> None:
    # old: every writer (fold / precision / quantize --report, kv-plan and simulate --json, build-matrix's report)
    # turned inf, -inf and NaN into null
    finite = float(rng.standard_normal())
    obj = {"max_abs_diff": math.inf, "nested": [{"low": -math.inf, "err": math.nan}], "pair": (finite, math.inf),
           "missing": None}
    path = tmp_path / "r.json"
    if writer == "write_json":
        fsutil.write_json(path, obj)
    elif writer == "staged_json":
        with fsutil.staged_json(path, obj):
            pass
    else:
        path.write_text(jsonout.dumps(obj))
    got = _strict(path.read_text())
    assert got == {"max_abs_diff": "inf", "nested": [{"low": "-inf", "err": "nan"}], "pair": [finite, "inf"],
                   "missing": None}


def test_standardize_file_rewrites_only_bare_constants(tmp_path: Path, rng: np.random.Generator) -> None:
    v = float(rng.standard_normal())
    clean, dirty = tmp_path / "clean.json", tmp_path / "dirty.json"
    clean.write_text(json.dumps({"v": v}, indent=3))
    dirty.write_text(json.dumps({"v": v, "inf": math.inf, "ninf": -math.inf, "nan": math.nan}))
    before = clean.read_bytes()
    jsonout.standardize_file(clean)
    jsonout.standardize_file(dirty)
    assert clean.read_bytes() == before
    assert _strict(dirty.read_text()) == {"v": v, "inf": "inf", "ninf": "-inf", "nan": "nan"}


def _cast_model(path: Path, rng: np.random.Generator, to: int) -> Path:
    """y = Cast(x * w, to), w random."""
    w = numpy_helper.from_array(rng.uniform(0.5, 2.0, H).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["h"]), helper.make_node("Cast", ["h"], ["y"], to=to)],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, H])],
                          [helper.make_tensor_value_info("y", to, [2, H])], initializer=[w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def test_string_outputs_are_refused_in_one_line(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    # old: Polygraphy's comparator subtracted the two string outputs: exit 3, "internal error: TypeError:
    # unsupported operand type(s) for -: 'str' and 'str'"
    from trtforge_testing import assert_one_line_error

    a = _cast_model(tmp_path / "a.onnx", rng, TensorProto.STRING)
    b = _cast_model(tmp_path / "b.onnx", rng, TensorProto.STRING)
    assert_one_line_error(cli("diff", a, b, "--save", tmp_path / "r.json"), 2, "output 'y' is a string tensor",
                          "fold --check")
    assert not list(tmp_path.glob("r*.json"))


def test_an_output_onnxruntime_cannot_return_names_the_fix(cli, tmp_path: Path, rng: np.random.Generator) -> None:
    # old: a bfloat16 output (onnxruntime's Python API has no NumPy type for it) was blamed on the inputs' shapes:
    # "check the models run in onnxruntime and pass --shape for inputs whose size matters"
    from trtforge_testing import assert_one_line_error

    a = _cast_model(tmp_path / "a.onnx", rng, TensorProto.BFLOAT16)
    assert_one_line_error(cli("diff", a, a, "--precision", "bf16"), 2, "cannot return an output of this type",
                          "casts such outputs to float32")
