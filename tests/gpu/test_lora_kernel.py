"""The LoRA CUDA kernels on a real GPU against the float64 NumPy reference (skipped without a CUDA device).

Needs only numpy and cuda-python (driver API; PTX from NVRTC or nvcc): no torch, no TensorRT, no ml_dtypes (bf16 is
converted with bit arithmetic here). Run with ``pytest tests/gpu`` or ``python tests/gpu/test_lora_kernel.py`` (no
pytest needed then); ``tests/gpu/run_all.sh`` runs the tests and the benchmark. A failure names the case, the worst
element (token, column, slot), the values and the tolerance.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator

import numpy as np

try:
    import pytest
except ImportError:  # plain `python tests/gpu/test_lora_kernel.py` on a machine without pytest

    class _Mark:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            def deco(*args, **kwargs):  # type: ignore[no-untyped-def]
                return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else (lambda f: f)
            return deco

    class _PytestStandIn:
        mark = _Mark()

        @staticmethod
        def fixture(*args, **kwargs):  # type: ignore[no-untyped-def]
            return args[0] if args and callable(args[0]) else (lambda f: f)

        @staticmethod
        def skip(msg: str) -> None:
            raise RuntimeError(msg)

    pytest = _PytestStandIn()  # type: ignore[assignment]

import plain_run  # tests/_support

from trtforge.plugins.lora import reference, spec


def _gpu_or_skip() -> None:
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        err2, count = driver.cuDeviceGetCount()
        if int(err) != 0 or int(err2) != 0 or int(count) == 0:
            raise RuntimeError(f"cuInit {err}, device count {count}")
    except Exception as exc:  # no cuda-python, no driver, or no device
        msg = f"needs a CUDA GPU ({type(exc).__name__}: {exc})"
        if os.environ.get("TRTFORGE_REQUIRE_GPU") == "1":  # tests/gpu/run_all.sh: a skip there is a failure
            raise AssertionError(f"TRTFORGE_REQUIRE_GPU=1 but the GPU tests cannot run: {msg}") from exc
        pytest.skip(msg)


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


# relative to max(|want|, rms(want)). The kernel reads the same rounded inputs as the float64 reference, sums in fp32
# (~1e-6 relative here) and rounds once, so the error is at most half an ulp of the output: 2^-11 (4.9e-4) for fp16,
# 2^-8 (3.9e-3) for bf16. The tolerances leave a 4x / 2.5x margin; a missed tile or token is far above them.
TOL = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-5}


class Device:
    """Tiny cuda-python driver helper: allocations freed on release/close; every call checked."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        from trtforge.plugins.lora.launch import LoraLauncher

        self.drv = driver
        self.launcher = LoraLauncher()  # makes a context current
        self.ptrs: list[int] = []
        la = self.launcher
        print(f"\n[gpu] {la.arch}, {la.sm_count} SMs, kernel loaded as {la.image_kind} from {la.image.compiler}, "
              f"driver {self.check(driver.cuDriverGetVersion(), 'cuDriverGetVersion')}", file=sys.stderr)

    def check(self, res, what: str = "CUDA call"):  # type: ignore[no-untyped-def]
        err, *rest = res if isinstance(res, tuple) else (res,)
        assert int(err) == 0, f"{what} failed: {getattr(err, 'name', err)}"
        return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)

    def put(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)
        ptr = int(self.check(self.drv.cuMemAlloc(max(a.nbytes, 1)), "cuMemAlloc"))
        self.check(self.drv.cuMemcpyHtoD(ptr, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")
        self.ptrs.append(ptr)
        return ptr

    def get(self, ptr: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        self.check(self.drv.cuCtxSynchronize(), "cuCtxSynchronize (a kernel failed: trap/illegal address?)")
        self.check(self.drv.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def release(self) -> None:
        self.check(self.drv.cuCtxSynchronize(), "cuCtxSynchronize")
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


def make_case(tokens: int, h: int, o: int, r: int, n: int, seed: int, per_sequence: bool = False,
              adapter_rank: int | None = None):  # type: ignore[no-untyped-def]
    """Random inputs; slot ids uniform in [-1, n) (so about 1/(n+1) of the tokens have no adapter). Adapters of
    ``adapter_rank`` < r are zero-padded to the pool's rank r."""
    g = np.random.default_rng(seed)
    x_shape = (tokens // 4, 4, h) if per_sequence else (tokens, h)
    slot_shape = (x_shape[0],) if per_sequence else (tokens,)
    ids = g.integers(-1, n, size=slot_shape).astype(np.int32)
    ar = r if adapter_rank is None else adapter_rank
    a = np.zeros((n, h, r))
    b = np.zeros((n, r, o))
    a[:, :, :ar] = g.standard_normal((n, h, ar)) / np.sqrt(h)
    b[:, :ar] = g.standard_normal((n, ar, o)) / np.sqrt(ar)
    return {"x": g.standard_normal(x_shape), "y": g.standard_normal((*x_shape[:-1], o)), "a": a, "b": b,
            "ids": ids, "scales": g.uniform(0.5, 2.0, n).astype(np.float32)}


def _upload(dev: Device, case: dict, dtype: str):  # type: ignore[no-untyped-def]
    x, y, a, b = (to_device_dtype(case[k], dtype) for k in ("x", "y", "a", "b"))
    n, h, r = case["a"].shape
    o = case["b"].shape[-1]
    fields = spec.LoraFields(max_rank=r, num_slots=n, in_features=h, out_features=o, tile=case.get("tile", 128))
    tokens = int(np.prod(x.shape[:-1]))
    tps = spec.tokens_per_slot(case["x"].shape, case["ids"].shape)
    ptr = {k: dev.put(v) for k, v in (("x", x), ("y", y), ("a", a), ("b", b), ("ids", case["ids"]),
                                       ("scales", case["scales"]))}
    common = dict(x=ptr["x"], lora_a=ptr["a"], lora_b=ptr["b"], slot_ids=ptr["ids"], scales=ptr["scales"],
                  num_tokens=tokens, tokens_per_slot=tps)
    return fields, y, ptr, common


def _nan_like(y: np.ndarray) -> np.ndarray:
    return np.full_like(y, 0x7FC0) if y.dtype == np.uint16 else np.full_like(y, np.nan)  # bf16 bits or float NaN


def run_kernel(dev: Device, case: dict, dtype: str, mode: str = "fused") -> tuple[np.ndarray, np.ndarray]:
    """(output as float64, y as the kernel saw it, as float64). mode: fused (in place), simple (out of place),
    simple_inplace, op (run_op out of place: y copied to out, then updated; y itself must stay unchanged),
    triton0..3 (the Triton kernel, out of place), plugin (run_variant under tactic AUTO, out of place)."""
    fields, y, ptr, common = _upload(dev, case, dtype)
    if mode == "fused":
        out_ptr = ptr["y"]
        dev.launcher.launch(0, fields, dtype, y=ptr["y"], **common)
    elif mode == "simple":
        out_ptr = dev.put(_nan_like(y))  # NaN: every element must be written by the kernel
        dev.launcher.launch_simple(0, fields, dtype, y=ptr["y"], out=out_ptr, **common)
    elif mode == "simple_inplace":
        out_ptr = ptr["y"]
        dev.launcher.launch_simple(0, fields, dtype, y=ptr["y"], out=out_ptr, **common)
    elif mode.startswith("triton") or mode == "plugin":
        # the Triton small-batch kernel (config i) or the plugin's default path (tactic AUTO), out of place, as
        # enqueue calls them; y must stay unchanged and every output element be written
        from trtforge.plugins.lora.small_launch import launch_small, run_variant
        from trtforge.plugins.lora.variants import AUTO

        out_ptr = dev.put(_nan_like(y))
        if mode == "plugin":
            run_variant(dev.launcher, 0, fields, dtype, AUTO, y=ptr["y"], out=out_ptr, **common)
        else:
            launch_small(dev.launcher, 0, fields, dtype, int(mode[6:]), y=ptr["y"], out=out_ptr, **common)
        assert np.array_equal(dev.get(ptr["y"], y), y), f"{mode} must not modify y"
    else:
        out_ptr = dev.put(_nan_like(y))
        dev.launcher.run_op(0, fields, dtype, y=ptr["y"], out=out_ptr, **common)
        y_after = dev.get(ptr["y"], y)
        assert np.array_equal(y_after, y), "run_op out of place must not modify y"
    got = dev.get(out_ptr, y)
    dev.release()
    return from_device_dtype(got, dtype), from_device_dtype(y, dtype)


def check(case: dict, got: np.ndarray, y_seen: np.ndarray, dtype: str, label: str = "", repeats: int = 1) -> None:
    """``got`` against y + repeats * update (float64 reference on the values the kernel read)."""
    q = {k: from_device_dtype(to_device_dtype(case[k], dtype), dtype) for k in ("x", "a", "b")}
    n = case["a"].shape[0]
    ids = np.where((case["ids"] >= 0) & (case["ids"] < n), case["ids"], -1)
    upd = reference.lora_update(q["x"], q["a"], q["b"], ids, case["scales"])
    want = y_seen + repeats * upd
    slots = reference.expand_slots(ids, case["x"].shape)
    off = slots < 0
    if repeats == 1:
        bad = ~(got[off] == y_seen[off])
        assert not bad.any(), f"{label}: {int(bad.sum())} elements of tokens without adapter changed (keep y's bits)"
    assert np.isfinite(got).all(), f"{label}: {int((~np.isfinite(got)).sum())} non-finite outputs"
    tol = TOL[dtype] * repeats
    err = np.abs(got - want)
    bound = tol * np.maximum(np.abs(want), np.sqrt(np.mean(want**2)))
    ratio = err / bound
    worst = float(ratio.max()) if ratio.size else 0.0
    if worst > 1.0:
        idx = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        flat_tok = int(np.ravel_multi_index(idx[:-1], ratio.shape[:-1]))
        n_bad = int((ratio > 1).sum())
        raise AssertionError(
            f"{label}: {n_bad}/{ratio.size} elements beyond tolerance; worst {worst:.2f}x at token {flat_tok} column "
            f"{idx[-1]} (slot {int(slots.reshape(-1)[flat_tok])}): got {float(got[idx]):.6g}, want "
            f"{float(want[idx]):.6g}, y {float(y_seen[idx]):.6g}, update {float(upd[idx]):.6g}; tol {tol:g} relative; "
            f"max abs err {float(err.max()):.3g}")


CASES = list(itertools.product([1, 7, 128, 2048], [(4096, 4096), (1000, 1500)], [8, 16, 64],
                               ["float16", "bfloat16"]))


def _id(t: int, hw: tuple[int, int], r: int, d: str) -> str:
    return f"T{t}-H{hw[0]}xO{hw[1]}-r{r}-{d}"


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,hw,rank,dtype", CASES, ids=[_id(*c) for c in CASES])
def test_fused_kernel_matches_float64_reference(dev, tokens, hw, rank, dtype):
    case = make_case(tokens, hw[0], hw[1], rank, 8, seed=tokens * 1000 + rank)
    got, y_seen = run_kernel(dev, case, dtype)
    check(case, got, y_seen, dtype, _id(tokens, hw, rank, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_simple_kernel_run_op_and_per_sequence(dev, dtype):
    case = make_case(128, 1000, 1500, 16, 8, seed=7)
    for mode in ("simple", "simple_inplace", "op"):
        got, y_seen = run_kernel(dev, case, dtype, mode)
        check(case, got, y_seen, dtype, f"{mode} {dtype}")
    dev.launcher.simple_max_tokens = 128  # run_op through the scratch-free kernel (no copy of y)
    try:
        got, y_seen = run_kernel(dev, case, dtype, "op")
    finally:
        dev.launcher.simple_max_tokens = 0
    check(case, got, y_seen, dtype, f"op via simple {dtype}")
    seq = make_case(64, 512, 384, 8, 4, seed=8, per_sequence=True)
    for mode in ("fused", "simple"):
        got, y_seen = run_kernel(dev, seq, dtype, mode)
        check(seq, got, y_seen, dtype, f"per-sequence {mode} {dtype}")


@pytest.mark.gpu
def test_fp32_rank_padding_tiles_and_out_of_range_slots(dev):
    """fp32; rank-8 and rank-3 adapters padded to max_rank 64; every tile tactic; ids >= N count as no adapter."""
    for tile in spec.TILE_CHOICES:
        case = make_case(300, 1000, 700, 64, 8, seed=tile, adapter_rank=8 if tile != 64 else 3)
        case["tile"] = tile
        case["ids"][:5] = 8  # out of range (N = 8): no adapter
        got, y_seen = run_kernel(dev, case, "float32")
        check(case, got, y_seen, "float32", f"fp32 tile {tile}")


@pytest.mark.gpu
def test_repeated_launches_reset_control_words(dev):
    """Launches of growing and shrinking sizes on one launcher (one scratch, zeroed once): each must be right."""
    for i, tokens in enumerate([2048, 1, 300, 7, 2048, 5, 4099, 33]):
        case = make_case(tokens, 512, 640, 16, 8, seed=100 + i)
        got, y_seen = run_kernel(dev, case, "float16")
        check(case, got, y_seen, "float16", f"launch {i} (T={tokens})")


@pytest.mark.gpu
def test_all_slots_off_and_all_one_slot(dev):
    case = make_case(256, 512, 512, 8, 4, seed=3)
    case["ids"][:] = -1
    got, y_seen = run_kernel(dev, case, "bfloat16")
    assert np.array_equal(got, y_seen)
    case["ids"][:] = 2  # 256 tokens in one slot: 16 chunks of one slot
    got, y_seen = run_kernel(dev, case, "bfloat16")
    check(case, got, y_seen, "bfloat16", "all tokens in slot 2")


@pytest.mark.gpu
def test_many_slots_and_many_tokens(dev):
    """4096 slots (the sort's 32 KiB shared histogram); 70000 tokens (more than grid y's 65535) for both kernels."""
    case = make_case(2048, 128, 96, 4, 4096, seed=11)
    got, y_seen = run_kernel(dev, case, "float16")
    check(case, got, y_seen, "float16", "4096 slots")
    big = make_case(70000, 64, 48, 4, 8, seed=12)
    for mode in ("fused", "simple"):
        got, y_seen = run_kernel(dev, big, "float16", mode)
        check(big, got, y_seen, "float16", f"70000 tokens {mode}")


@pytest.mark.gpu
def test_cuda_graph_replay_and_two_streams(dev):
    """3 launches captured in a CUDA graph, replayed twice (control words reset inside the graph); then two
    launchers (two scratches) on two streams at once."""
    drv, c = dev.drv, dev.check
    case = make_case(200, 1000, 700, 16, 8, seed=21)
    dtype = "float32"
    fields, y, ptr, common = _upload(dev, case, dtype)
    stream = int(c(drv.cuStreamCreate(int(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate"))
    y0 = y.copy()
    dev.launcher.launch(stream, fields, dtype, y=ptr["y"], **common)  # warm-up: allocates the scratch
    c(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
    c(drv.cuMemcpyHtoD(ptr["y"], y0.ctypes.data, y0.nbytes), "cuMemcpyHtoD")
    c(drv.cuStreamBeginCapture(stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture")
    for _ in range(3):
        dev.launcher.launch(stream, fields, dtype, y=ptr["y"], **common)
    graph = c(drv.cuStreamEndCapture(stream), "cuStreamEndCapture")
    exe = c(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    for _ in range(2):
        c(drv.cuGraphLaunch(exe, stream), "cuGraphLaunch")
    c(drv.cuStreamSynchronize(stream), "cuStreamSynchronize after graph replays")
    got = from_device_dtype(dev.get(ptr["y"], y), dtype)
    check(case, got, from_device_dtype(y0, dtype), dtype, "graph: 2 replays x 3 launches", repeats=6)
    c(drv.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
    c(drv.cuGraphDestroy(graph), "cuGraphDestroy")
    dev.release()

    from trtforge.plugins.lora.launch import LoraLauncher

    other = LoraLauncher()
    s2 = int(c(drv.cuStreamCreate(int(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate"))
    c1, c2 = make_case(2048, 1024, 1024, 16, 8, seed=22), make_case(1500, 1024, 1024, 16, 8, seed=23)
    f1, y1, p1, k1 = _upload(dev, c1, "float16")
    f2, y2, p2, k2 = _upload(dev, c2, "float16")
    for _ in range(2):  # first round allocates each scratch; second runs both truly concurrently
        c(drv.cuMemcpyHtoD(p1["y"], y1.ctypes.data, y1.nbytes), "cuMemcpyHtoD")
        c(drv.cuMemcpyHtoD(p2["y"], y2.ctypes.data, y2.nbytes), "cuMemcpyHtoD")
        dev.launcher.launch(stream, f1, "float16", y=p1["y"], **k1)
        other.launch(s2, f2, "float16", y=p2["y"], **k2)
        c(drv.cuCtxSynchronize(), "cuCtxSynchronize after two streams")
    check(c1, from_device_dtype(dev.get(p1["y"], y1), "float16"), from_device_dtype(y1, "float16"), "float16",
          "stream 1")
    check(c2, from_device_dtype(dev.get(p2["y"], y2), "float16"), from_device_dtype(y2, "float16"), "float16",
          "stream 2")
    dev.release()
    other.close()
    c(drv.cuStreamDestroy(stream), "cuStreamDestroy")
    c(drv.cuStreamDestroy(s2), "cuStreamDestroy")


def _main() -> int:
    """Without pytest: every test in order, one line each, exit 1 on any failure."""
    try:
        _gpu_or_skip()
    except AssertionError:
        raise
    except BaseException as exc:  # pytest's Skipped (or the stand-in's SystemExit)
        print(f"skipped: {exc}")
        return 0
    d = Device()
    runs: list[tuple[str, object, tuple]] = [(_id(*c), test_fused_kernel_matches_float64_reference, (*c,))
                                             for c in CASES]
    runs += [(f"simple/run_op/per-sequence {dt}", test_simple_kernel_run_op_and_per_sequence, (dt,))
             for dt in ("float16", "bfloat16", "float32")]
    runs += [(fn.__name__, fn, ()) for fn in (test_fp32_rank_padding_tiles_and_out_of_range_slots,
                                              test_repeated_launches_reset_control_words,
                                              test_all_slots_off_and_all_one_slot, test_many_slots_and_many_tokens,
                                              test_cuda_graph_replay_and_two_streams)]
    return plain_run.run_plain(d, runs)


if __name__ == "__main__":
    raise SystemExit(_main())
