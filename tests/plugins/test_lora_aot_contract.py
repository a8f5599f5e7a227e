"""The AOT decorator plugin passes the inspection ``tensorrt.plugin`` applies at registration (issue 17, items 1-2).

Full TensorRT is not installable here, so the checks of ``tensorrt/plugin/_validate.py`` (``_parse_register_inputs``,
``_parse_register_return``, ``_validate_autotune``, ``_validate_aot_impl``, as published by NVIDIA/TensorRT) are
restated below, applied to the functions ``aot_functions`` builds with annotation classes standing in for
``trtp.TensorDesc`` & co. (only their identity matters to these checks). Negative controls show the restated checks
reject what the old module did (string annotations, ``tuple[TensorDesc, ...]``).
"""

import ast
import inspect
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trtforge.plugins.lora import aot_plugin, spec

pytest.importorskip("triton")


class TensorDesc:
    def __init__(self, shape: tuple, dtype: str) -> None:
        self.shape_expr, self.ndim, self.dtype = list(shape), len(shape), dtype


class AutoTuneCombination:
    def __init__(self, io: str, layouts: str, tactics: list | None = None) -> None:
        self.io, self.layouts, self.tactics = io, layouts, tactics


class KernelLaunchParams:
    pass


class SymExprs:
    def __init__(self, n: int) -> None:
        self.items: list[Any] = [None] * n

    def __setitem__(self, i: int, v: Any) -> None:
        self.items[i] = v


class SymIntExprs(SymExprs):
    pass


TRTP = types.SimpleNamespace(TensorDesc=TensorDesc, AutoTuneCombination=AutoTuneCombination,
                             KernelLaunchParams=KernelLaunchParams, SymExprs=SymExprs, SymIntExprs=SymIntExprs,
                             SymInt32=lambda v: v)
SERIALIZABLE = (int, float, bytes, bool, str)


def parse_register(fn: Any) -> tuple[list[str], dict[str, Any], int]:
    """_parse_register_inputs + _parse_register_return: tensors first, serializable attrs, TensorDesc return."""
    sig = inspect.signature(fn)
    tensors: list[str] = []
    attrs: dict[str, Any] = {}
    for name, p in sig.parameters.items():
        assert p.annotation is not inspect.Parameter.empty
        if issubclass(p.annotation, TensorDesc):  # raises TypeError on a string annotation, as TensorRT does
            assert not attrs, "TensorDescs and attributes interspersed"
            tensors.append(name)
        else:
            assert p.annotation in SERIALIZABLE and name not in ("outputs", "stream", "tactic")
            attrs[name] = p.annotation
    ret = sig.return_annotation
    if typing.get_origin(ret) is not tuple:
        assert inspect.isclass(ret) and issubclass(ret, TensorDesc)
        n_out = 1
    else:
        assert all(issubclass(a, TensorDesc) for a in typing.get_args(ret))
        n_out = len(typing.get_args(ret))
    return tensors, attrs, n_out


def check_params(fn: Any, tensors: list[str], attrs: dict[str, Any], tail: str) -> None:
    sig = inspect.signature(fn)
    used = []
    for name, p in sig.parameters.items():
        if p.annotation is inspect.Parameter.empty:
            continue
        if name == "outputs":
            assert typing.get_origin(p.annotation) is tuple
            assert all(issubclass(a, TensorDesc) for a in typing.get_args(p.annotation))
        elif name == "tactic":
            assert issubclass(p.annotation, int)
        elif issubclass(p.annotation, TensorDesc):
            assert name in tensors
        else:
            assert attrs[name] == p.annotation
            used.append(name)
    expected = "(" + ", ".join(tensors) + "".join(f", {a}" for a in attrs if a in used) + tail
    assert f"({', '.join(sig.parameters)})" == expected


def check_autotune(fn: Any, tensors: list[str], attrs: dict[str, Any]) -> None:
    check_params(fn, tensors, attrs, ", outputs)")
    ret = inspect.signature(fn).return_annotation
    assert typing.get_origin(ret) is list and all(issubclass(a, AutoTuneCombination) for a in typing.get_args(ret))


def check_aot(fn: Any, tensors: list[str], attrs: dict[str, Any]) -> None:
    check_params(fn, tensors, attrs, ", outputs, tactic)")
    ret = inspect.signature(fn).return_annotation
    assert typing.get_origin(ret) is tuple
    args = typing.get_args(ret)
    assert len(args) == 4
    for a in args[:2]:
        members = typing.get_args(a) if typing.get_origin(a) in (typing.Union, types.UnionType) else (a,)
        assert all(m is str or m is bytes for m in members)
    assert issubclass(args[2], KernelLaunchParams) and issubclass(args[3], SymExprs)


def test_module_keeps_annotations_as_objects():
    tree = ast.parse(Path(aot_plugin.__file__).read_text())
    futures = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    assert not any(a.name == "annotations" for n in futures for a in n.names)


def test_registration_passes_tensorrt_plugin_inspection():
    desc, autotune, aot = aot_plugin.aot_functions(TRTP, "sm_90")
    tensors, attrs, n_out = parse_register(desc)
    assert tensors == list(spec.INPUT_NAMES) and list(attrs) == list(spec.FIELD_NAMES) and n_out == 1
    check_autotune(autotune, tensors, attrs)
    check_aot(aot, tensors, attrs)


def test_restated_checks_reject_the_old_forms():
    def stringly(x: "TensorDesc", max_rank: int) -> "TensorDesc":
        return x

    with pytest.raises(TypeError):  # issubclass() arg 1 must be a class
        parse_register(stringly)

    def ellipsis(x: TensorDesc, outputs: tuple[TensorDesc, ...]) -> list[AutoTuneCombination]:
        return []

    with pytest.raises(TypeError):  # issubclass(Ellipsis, TensorDesc)
        check_autotune(ellipsis, ["x"], {})

    def good(x: TensorDesc, outputs: tuple[TensorDesc]) -> list[AutoTuneCombination]:
        return []

    check_autotune(good, ["x"], {})


@pytest.mark.parametrize(("x_shape", "slot_shape", "tps"), [((3, 5, 200), (3, 5), 1), ((3, 5, 200), (3,), 5),
                                                            ((11, 200), (11,), 1)])
def test_aot_impl_launch_order_inputs_scalars_outputs(x_shape, slot_shape, tps):
    """Extra args follow the kernel's parameter order after the 6 inputs; the output pointer comes last."""
    from trtforge.plugins.lora.triton_kernel import SCALAR_ARGS, signature

    sig = list(signature("float16"))
    assert sig == [*spec.INPUT_NAMES, *SCALAR_ARGS, *spec.OUTPUT_NAMES]
    _, _, aot = aot_plugin.aot_functions(TRTP, "sm_86")
    descs = [TensorDesc(x_shape, "HALF"), TensorDesc((*x_shape[:-1], 70), "HALF"), TensorDesc((4, 200, 16), "HALF"),
             TensorDesc((4, 16, 70), "HALF"), TensorDesc(slot_shape, "INT32"), TensorDesc((4,), "FLOAT")]
    name, ptx, params, extra = aot(*descs, 16, 4, 200, 70, 64, (TensorDesc((*x_shape[:-1], 70), "HALF"),), 0)
    tokens = int(np.prod(x_shape[:-1]))
    assert extra.items == [tokens, 200, 70, 16, 4, tps]
    assert (params.grid_x, params.grid_y, params.block_x) == (tokens, 1, 128)
    body = ptx.split(f".entry {name}(", 1)[1].split(")", 1)[0]
    decls = [d.split()[1] for d in body.split(",")]
    assert decls == [".u64"] * 6 + [".u32"] * 6 + [".u64"], decls  # x y a b ids scales | T H O R N tps | out
    assert ".version 8.7" in ptx and ".target sm_86" in ptx
