"""``build --dim NAME=MIN:OPT:MAX``: a named dynamic dimension other than batch/sequence gets its range in every
optimization profile (a real TensorRT-RTX build here); every input sharing the name gets it; bad overrides exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from trtforge_testing import assert_one_line_error


def _patches(path: Path, dim: str = "patches") -> Path:
    """x [batch, DIM, 8] and mask [batch, DIM] -> y [batch, 8] (masked sum over the patches)."""
    nodes = [h.make_node("Cast", ["mask"], ["mf"], to=T.FLOAT), h.make_node("Unsqueeze", ["mf", "axis"], ["m3"]),
             h.make_node("Mul", ["x", "m3"], ["xm"]), h.make_node("ReduceSum", ["xm", "one"], ["y"], keepdims=0)]
    graph = h.make_graph(nodes, "patches", [h.make_tensor_value_info("x", T.FLOAT, ["batch", dim, 8]),
                                            h.make_tensor_value_info("mask", T.BOOL, ["batch", dim])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["batch", 8])],
                         [h.make_tensor("axis", T.INT64, [1], [2]), h.make_tensor("one", T.INT64, [1], [1])])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def test_dim_override_sizes_every_profile(cli, tmp_path: Path) -> None:
    src = _patches(tmp_path / "p.onnx")
    res = cli("build", src, "--profile", "a10", "-o", tmp_path / "e", "--no-progress")
    assert_one_line_error(res, 2, "'patches'", "--dim patches=MIN:OPT:MAX")
    res = cli("build", src, "--profile", "a10", "-o", tmp_path / "e", "--no-progress", "--dim", "patches=2:16:64")
    assert res.code == 0, res.err
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    profile = {t["name"]: t for t in manifest["inputs"]}
    from trtforge.profiles.loader import load_profile

    shapes = load_profile("a10").shapes
    for name, tail in (("x", [8]), ("mask", [])):
        ranges = profile[name]["profiles"]
        assert len(ranges) == len(shapes) and profile[name]["shape"] == [-1, -1, *tail]
        for r, sp in zip(ranges, shapes, strict=True):
            assert r["min"] == [sp.batch.min, 2, *tail] and r["opt"] == [sp.batch.opt, 16, *tail]
            assert r["max"] == [sp.batch.max, 64, *tail]
    # The Triton entry takes the dimension as dynamic, and --check agrees with the manifest.
    assert cli("triton", tmp_path / "e", "--repo", tmp_path / "repo", "--name", "p").code == 0
    assert cli("triton", "--check", tmp_path / "repo" / "p").code == 0


@pytest.mark.parametrize(("dim", "why"), [
    ("height=1:2:3", "no dynamic dimension named 'height'"),
    ("batch=1:2:3", "come from the profile"),
    ("patches=4:2:8", "0 <= MIN <= OPT <= MAX"),
    ("patches=0:0:0", "0 <= MIN <= OPT <= MAX (and MAX >= 1"),
    # TensorRT keeps profile dims in 32 bits: 2**31 was exit 3 from set_shape, 2**32 wrapped and built (exit 0).
    ("patches=1:2:2147483648", "at most 2147483647"),
    ("patches=1:2:4294967296", "at most 2147483647"),
    ("patches=1:2:99999999999999999999", "at most 2147483647"),
    ("patches=1:2", "NAME=MIN:OPT:MAX"),
    ("patches", "NAME=MIN:OPT:MAX"),
])
def test_bad_dim_override_is_exit_2(cli, tmp_path: Path, dim: str, why: str) -> None:
    src = _patches(tmp_path / "p.onnx")
    res = cli("build", src, "--profile", "a10", "-o", tmp_path / "e", "--no-progress", "--dim", dim)
    assert_one_line_error(res, 2, "--dim", why)
    assert not (tmp_path / "e").exists()


def test_a_dim_name_holding_equals_signs(cli, tmp_path: Path) -> None:
    """ONNX allows any string as a dim_param: for one named 'n=patches' the suggested ``--dim n=patches=MIN:OPT:MAX``
    was refused ('expected NAME=MIN:OPT:MAX'), so the model could not be built at all."""
    src = _patches(tmp_path / "p.onnx", dim="n=patches")
    res = cli("build", src, "--profile", "a10", "-o", tmp_path / "e", "--no-progress")
    assert_one_line_error(res, 2, "--dim n=patches=MIN:OPT:MAX")
    res = cli("build", src, "--profile", "a10", "-o", tmp_path / "e", "--no-progress", "--dim", "n=patches=2:4:8")
    assert res.code == 0, res.err
    x = next(i for i in json.loads((tmp_path / "e" / "manifest.json").read_text())["inputs"] if i["name"] == "x")
    assert [p["max"][1] for p in x["profiles"]] == [8, 8]


def test_a_dim_may_start_at_zero(cli, tmp_path: Path) -> None:
    """A decoder's past length is 0 at its first step: --dim past=0:...:... was refused ("need 1 <= MIN") although
    TensorRT(-RTX) builds a profile with a 0 minimum. Now it builds, the manifest says 0, and Triton takes it."""
    src = _patches(tmp_path / "p.onnx")
    res = cli("build", src, "--profile", "a10", "-o", tmp_path / "e", "--no-progress", "--dim", "patches=0:2:8")
    assert res.code == 0, res.err
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    x = next(i for i in manifest["inputs"] if i["name"] == "x")
    assert [p["min"][1] for p in x["profiles"]] == [0, 0] and x["max"][1] == 8
    assert cli("triton", tmp_path / "e", "--repo", tmp_path / "repo", "--name", "p").code == 0
    assert cli("triton", "--check", tmp_path / "repo" / "p").code == 0
