"""The Triton small-batch LoRA kernel: its exact code run by Triton's interpreter (CPU) against the float64
reference, and compiled for sm_80/86/90 with registers, spills and shared memory recorded (issue 17, items 7-8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from trtforge.plugins.lora import reference
from trtforge.plugins.lora.triton_kernel import SMALL_CONFIGS, grid, kernel

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
# bound on |out - ref| in units of |ref| + 1: one rounding of the output (2^-11 fp16, 2^-8 bf16) plus accumulation
TOL = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 2e-5}


def _torch(a: np.ndarray) -> Any:
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def _numpy(t: Any, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def run_interpreted(case: dict, dtype: str, config_index: int, tokens_per_slot: int = 1) -> np.ndarray:
    """Run the kernel in Triton's interpreter. Called in a child process that imported Triton with
    ``TRITON_INTERPRET=1`` (Triton must be imported under it; this test process also compiles for GPUs)."""
    cfg = SMALL_CONFIGS[config_index]
    x, y, a, b, ids, sc = (case[k] for k in ("x", "y", "a", "b", "ids", "scales"))
    t, h = int(np.prod(x.shape[:-1])), x.shape[-1]
    n, r, o = b.shape
    out = torch.full(y.shape, float("nan"), dtype=_torch(y).dtype)
    kernel(interpret=True)[grid(t, o, r, dtype, cfg)](
        _torch(x), _torch(y), _torch(a), _torch(b), _torch(ids), _torch(sc), t, h, o, r, n, tokens_per_slot, out,
        **cfg.constexprs(r, dtype))
    return _numpy(out, dtype)


def _child(folder: str) -> None:
    """Child process entry: run every saved case, save its output beside it."""
    for path in sorted(Path(folder).glob("case-*.npz")):
        data = dict(np.load(path))
        dtype, cfg, tps = str(data.pop("dtype")), int(data.pop("cfg")), int(data.pop("tps"))
        case = {k: (v.view(ml_dtypes.bfloat16) if dtype == "bfloat16" and k in "x y a b" else v)
                for k, v in data.items()}
        got = run_interpreted(case, dtype, cfg, tps)
        np.save(path.with_suffix(".out.npy"), got.view(np.int16) if dtype == "bfloat16" else got)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, dict, str, int, int], None]:
    """Queue cases; ``run()`` executes them all in one interpreter child process; ``result(name)`` reads one."""
    folder = tmp_path_factory.mktemp("triton-interp")

    class Runner:
        def add(self, name: str, case: dict, dtype: str, cfg: int, tps: int = 1) -> None:
            arrays = {k: (v.view(np.int16) if v.dtype == ml_dtypes.bfloat16 else v) for k, v in case.items()}
            np.savez(folder / f"case-{name}.npz", dtype=dtype, cfg=cfg, tps=tps, **arrays)

        def run(self) -> None:
            env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).parent)}
            code = f"import test_lora_triton as m; m._child({str(folder)!r})"
            proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]

        def result(self, name: str, dtype: str) -> np.ndarray:
            got = np.load(folder / f"case-{name}.out.npy")
            return got.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else got

    return Runner()  # type: ignore[return-value]


def make_case(g: np.random.Generator, t: int, h: int, o: int, r: int, n: int, dtype: str) -> dict:
    d = NP[dtype]
    ids = g.integers(-1, n, size=t).astype(np.int32)
    if t >= 4:
        ids[:4] = -1, n - 1, n + 3, -2  # no adapter, the last slot, out of range above and below (no adapter)
    else:
        ids[0] = n - 1
    return {"x": g.standard_normal((t, h)).astype(d), "y": g.standard_normal((t, o)).astype(d),
            "a": (g.standard_normal((n, h, r)) / np.sqrt(h)).astype(d),
            "b": (g.standard_normal((n, r, o)) / np.sqrt(r)).astype(d), "ids": ids,
            "scales": g.uniform(0.5, 2.0, size=n).astype(np.float32)}


CASES = [  # (tokens, H, O, rank, slots, dtype, config): tails on every axis, ranks 8/16/64, each config and dtype
    (1, 72, 100, 16, 8, "float16", 0),
    (7, 200, 130, 8, 5, "bfloat16", 0),
    (7, 96, 300, 64, 3, "float32", 1),
    (128, 80, 70, 16, 8, "float16", 2),
    (40, 48, 40, 8, 4096, "bfloat16", 3),
    (9, 40, 50, 64, 3, "bfloat16", 3),
    (20, 130, 33, 8, 2, "float32", 0),
]


def _cases() -> list[tuple[str, dict, str, int, int]]:
    out = []
    for t, h, o, r, n, dtype, cfg in CASES:
        g = np.random.default_rng(1000 + t * 7 + r)
        out.append((f"{t}-{h}-{o}-{r}-{n}-{dtype}-{cfg}", make_case(g, t, h, o, r, n, dtype), dtype, cfg, 1))
    g = np.random.default_rng(7)
    seq = make_case(g, 15, 40, 50, 16, 4, "float32")
    seq["ids"] = np.array([2, -1, 0], np.int32)  # 3 sequences of 5 tokens
    out.append(("per-sequence", seq, "float32", 0, 5))
    return out


def test_interpreted_kernel_matches_float64(interpreted):
    """Tokens 1/7/20/40/128, sizes off the tiles, ranks 8/16/64, 2-4096 slots, every config and dtype, slot -1
    and an out-of-range slot (no adapter): within one output rounding of float64; no-adapter tokens are y exactly."""
    cases = _cases()
    for name, case, dtype, cfg, tps in cases:
        interpreted.add(name, case, dtype, cfg, tps)
    interpreted.run()
    for name, case, dtype, _, tps in cases:
        got = interpreted.result(name, dtype).astype(np.float64)
        n = case["a"].shape[0]
        ids = np.where((case["ids"] >= 0) & (case["ids"] < n), case["ids"], -1).astype(np.int32)
        if tps > 1:
            b_ = ids.size
            ref = reference.lora_op(case["x"].reshape(b_, tps, -1), case["y"].reshape(b_, tps, -1), case["a"],
                                    case["b"], ids, case["scales"]).reshape(case["y"].shape)
            ids = np.repeat(ids, tps)
        else:
            ref = reference.lora_op(case["x"], case["y"], case["a"], case["b"], ids, case["scales"])
        ref64 = ref.astype(np.float64)
        err = np.abs(got - ref64) / (np.abs(ref64) + 1.0)
        assert np.isfinite(got).all() and err.max() <= TOL[dtype], (name, err.max())
        none = ids < 0
        assert np.array_equal(got[none], case["y"][none].astype(np.float64)), name
        assert none.any() or ids.size < 4, name
        assert (~none).any() and not np.array_equal(got[~none], case["y"][~none].astype(np.float64)), name


@pytest.mark.parametrize("cc", [80, 86, 90])
def test_compiles_per_sm_without_spills(cc, tmp_path):
    """Every variant the plugin can pick at decode (config 0: the AOT default) builds without register spills."""
    from trtforge.plugins.lora.triton_build import N_PARAMS, PTX_ISA, compile_image

    rows = []
    for dtype, rank in (("float16", 16), ("bfloat16", 16), ("float32", 64)):  # every dtype; ranks 16 and 64
        if True:
            im = compile_image(cc, dtype, rank, SMALL_CONFIGS[0])
            rows.append({"cc": cc, "dtype": dtype, "rank": rank, "registers": im.registers,
                         "spill_bytes": im.spill_bytes, "shared": im.shared, "ptx": im.ptx_version})
            assert im.ptx_version == f"{PTX_ISA // 10}.{PTX_ISA % 10}" and im.cubin.startswith(b"\x7fELF")
            assert im.ptx.split(f".entry {im.name}(", 1)[1].split(")", 1)[0].count(".param") == N_PARAMS
            assert 0 < im.registers <= 255 and im.spill_bytes == 0 and im.shared <= 48 * 1024, rows[-1]
    report = os.environ.get("TRTFORGE_LORA_RESOURCES")  # optional: where to write the table (bench/README use it)
    if report:
        with open(report, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
