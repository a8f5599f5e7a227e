"""The LoRA CUDA kernels on a real GPU against the float64 NumPy reference (skipped without a CUDA device).

Needs only numpy and cuda-python (driver API; PTX from NVRTC or nvcc): no torch, no TensorRT, no ml_dtypes (bf16 is
converted with bit arithmetic here). Run with ``pytest tests/gpu`` or ``python tests/gpu/test_lora_kernel.py``
(``tests/gpu/run_all.sh`` does both the tests and the benchmark).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest

from trtforge.plugins.lora import reference, spec


def _gpu_or_skip() -> None:
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        err2, count = driver.cuDeviceGetCount()
        if int(err) != 0 or int(err2) != 0 or int(count) == 0:
            raise RuntimeError(f"cuInit {err}, device count {count}")
    except Exception as exc:  # no cuda-python, no driver, or no device
        pytest.skip(f"needs a CUDA GPU ({type(exc).__name__}: {exc})")


# --- dtype helpers (bf16 without ml_dtypes) --------------------------------------------------------------------
def to_device_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    """float array -> the raw array the kernel reads (float16/float32, or uint16 bf16 bits, round to nearest even)."""
    if dtype == "float16":
        return a.astype(np.float16)
    if dtype == "float32":
        return a.astype(np.float32)
    bits = a.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_device_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


TOL = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 1e-5}


class Device:
    """Tiny cuda-python driver helper: allocations freed on close."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        from trtforge.plugins.lora.launch import LoraLauncher

        self.drv = driver
        self.launcher = LoraLauncher()  # makes a context current
        self.ptrs: list[int] = []

    def check(self, res):  # type: ignore[no-untyped-def]
        err, *rest = res if isinstance(res, tuple) else (res,)
        assert int(err) == 0, err
        return rest[0] if rest else None

    def put(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)
        ptr = self.check(self.drv.cuMemAlloc(max(a.nbytes, 1)))
        self.check(self.drv.cuMemcpyHtoD(ptr, a.ctypes.data, a.nbytes))
        self.ptrs.append(ptr)
        return int(ptr)

    def get(self, ptr: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        self.check(self.drv.cuCtxSynchronize())
        self.check(self.drv.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes))
        return out

    def release(self) -> None:
        for p in self.ptrs:
            self.drv.cuMemFree(p)
        self.ptrs.clear()

    def close(self) -> None:
        self.release()
        self.launcher.close()


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    _gpu_or_skip()
    d = Device()
    yield d
    d.close()


def make_case(tokens: int, h: int, o: int, r: int, n: int, seed: int, per_sequence: bool = False):  # type: ignore[no-untyped-def]
    g = np.random.default_rng(seed)
    x_shape = (tokens // 4, 4, h) if per_sequence else (tokens, h)
    slot_shape = (x_shape[0],) if per_sequence else (tokens,)
    ids = g.integers(-1, n, size=slot_shape).astype(np.int32)
    return {
        "x": g.standard_normal(x_shape), "y": g.standard_normal((*x_shape[:-1], o)),
        "a": g.standard_normal((n, h, r)) / np.sqrt(h), "b": g.standard_normal((n, r, o)) / np.sqrt(r),
        "ids": ids, "scales": g.uniform(0.5, 2.0, n).astype(np.float32),
    }


def run_kernel(dev: Device, case: dict, dtype: str, simple: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(kernel output as float64, y as the kernel saw it, as float64)."""
    x, y, a, b = (to_device_dtype(case[k], dtype) for k in ("x", "y", "a", "b"))
    n, h, r = case["a"].shape
    o = case["b"].shape[-1]
    fields = spec.LoraFields(max_rank=r, num_slots=n, in_features=h, out_features=o, tile=128)
    tokens = int(np.prod(x.shape[:-1]))
    tps = spec.tokens_per_slot(case["x"].shape, case["ids"].shape)
    ptr = {k: dev.put(v) for k, v in (("x", x), ("y", y), ("a", a), ("b", b), ("ids", case["ids"]),
                                       ("scales", case["scales"]))}
    common = dict(x=ptr["x"], lora_a=ptr["a"], lora_b=ptr["b"], slot_ids=ptr["ids"], scales=ptr["scales"],
                  num_tokens=tokens, tokens_per_slot=tps)
    if simple:
        out_ptr = dev.put(np.zeros_like(y))
        dev.launcher.launch_simple(0, fields, dtype, y=ptr["y"], out=out_ptr, **common)
    else:
        out_ptr = ptr["y"]
        dev.launcher.launch(0, fields, dtype, y=ptr["y"], **common)
    got = dev.get(out_ptr, y)
    dev.release()
    return from_device_dtype(got, dtype), from_device_dtype(y, dtype)


def check(case: dict, got: np.ndarray, y_seen: np.ndarray, dtype: str) -> None:
    # reference on the values the kernel really read (inputs rounded to the dtype), accumulated in float64
    q = {k: from_device_dtype(to_device_dtype(case[k], dtype), dtype) for k in ("x", "a", "b")}
    want = y_seen + reference.lora_update(q["x"], q["a"], q["b"], case["ids"], case["scales"])
    off = reference.expand_slots(case["ids"], case["x"].shape) < 0
    assert np.array_equal(got[off], y_seen[off]), "tokens with slot -1 must keep y's bits"
    tol = TOL[dtype]
    err = np.abs(got - want)
    bound = tol * (np.abs(want) + np.sqrt(np.mean(want**2)))
    worst = float(np.max(err / bound)) if err.size else 0.0
    assert worst <= 1.0, f"max error {float(err.max()):.3g} exceeds {tol} relative ({worst:.2f}x the bound)"


CASES = list(itertools.product([1, 7, 128, 2048], [(4096, 4096), (1000, 1500)], [8, 16, 64],
                               ["float16", "bfloat16"]))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,hw,rank,dtype", CASES,
                         ids=[f"T{t}-H{h}xO{o}-r{r}-{d}" for t, (h, o), r, d in CASES])
def test_fused_kernel_matches_float64_reference(dev, tokens, hw, rank, dtype):
    case = make_case(tokens, hw[0], hw[1], rank, 8, seed=tokens * 1000 + rank)
    got, y_seen = run_kernel(dev, case, dtype)
    check(case, got, y_seen, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_simple_kernel_and_per_sequence(dev, dtype):
    case = make_case(128, 1000, 1500, 16, 8, seed=7)
    got, y_seen = run_kernel(dev, case, dtype, simple=True)
    check(case, got, y_seen, dtype)
    seq = make_case(64, 512, 384, 8, 4, seed=8, per_sequence=True)
    for simple in (False, True):
        got, y_seen = run_kernel(dev, seq, dtype, simple=simple)
        check(seq, got, y_seen, dtype)


@pytest.mark.gpu
def test_repeated_launches_reset_control_words(dev):
    """Many launches of different sizes on one launcher (one scratch): each must be right (control words reset)."""
    for i, tokens in enumerate([2048, 1, 300, 7, 2048, 5]):
        case = make_case(tokens, 512, 640, 16, 8, seed=100 + i)
        got, y_seen = run_kernel(dev, case, "float16")
        check(case, got, y_seen, "float16")


@pytest.mark.gpu
def test_all_slots_off_and_all_one_slot(dev):
    case = make_case(256, 512, 512, 8, 4, seed=3)
    case["ids"][:] = -1
    got, y_seen = run_kernel(dev, case, "bfloat16")
    assert np.array_equal(got, y_seen)
    case["ids"][:] = 2  # 256 tokens in one slot: 16 chunks of one slot
    got, y_seen = run_kernel(dev, case, "bfloat16")
    check(case, got, y_seen, "bfloat16")


if __name__ == "__main__":  # without pytest: python tests/gpu/test_lora_kernel.py
    _gpu_or_skip()
    d = Device()
    failures = 0
    for t, (h, o), r, dt in CASES:
        try:
            test_fused_kernel_matches_float64_reference(d, t, (h, o), r, dt)
            print(f"ok   T{t} H{h} O{o} r{r} {dt}")
        except AssertionError as exc:
            failures += 1
            print(f"FAIL T{t} H{h} O{o} r{r} {dt}: {exc}")
    for fn, args in ((test_simple_kernel_and_per_sequence, ("float16",)),
                     (test_simple_kernel_and_per_sequence, ("bfloat16",)),
                     (test_repeated_launches_reset_control_words, ()), (test_all_slots_off_and_all_one_slot, ())):
        try:
            fn(d, *args)
            print(f"ok   {fn.__name__}{args}")
        except AssertionError as exc:
            failures += 1
            print(f"FAIL {fn.__name__}{args}: {exc}")
    d.close()
    raise SystemExit(1 if failures else 0)
