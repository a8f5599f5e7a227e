"""The CUDA kernel compiles to PTX for sm_80/86/90 (NVRTC or nvcc) and the launch planning is consistent."""

from __future__ import annotations

import math

import pytest

from trtforge.build_engine.core.errors import InputError
from trtforge.plugins.lora import spec
from trtforge.plugins.lora.launch import kernel_args, max_chunks, plan_launch, scratch_bytes
from trtforge.plugins.lora.ptx import (
    ENTRY_NAMES,
    PREPARE_ENTRY,
    SIMPLE_ENTRY_NAMES,
    compile_ptx,
    kernel_define,
    normalize_arch,
)


def _compiler_or_skip() -> None:
    from trtforge.plugins.lora.ptx import _find_nvcc

    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        load_nvidia_dynamic_lib("nvrtc")
        return
    except Exception:
        if _find_nvcc() is None:
            pytest.skip("neither libnvrtc nor nvcc is available")


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_90"])
def test_ptx_compiles_with_entry_points(arch, tmp_path, monkeypatch):
    _compiler_or_skip()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ptx = compile_ptx(arch, use_cache=False)
    assert ptx.target == arch
    assert set(ptx.entries) == set(ENTRY_NAMES.values()) | set(SIMPLE_ENTRY_NAMES.values()) | {PREPARE_ENTRY}
    assert b".version" in ptx.text and b"\0" not in ptx.text
    # parameters as launch.kernel_args / simple_args / prepare_args pass them: 9 pointers + 11 int32s (fused),
    # 7 + 6 (simple), 2 + 4 (prepare)
    for names, n_ptr, n_int in ((ENTRY_NAMES, 9, 11), (SIMPLE_ENTRY_NAMES, 7, 6), ({"": PREPARE_ENTRY}, 2, 4)):
        for name in names.values():
            body = ptx.text.split(f".entry {name}(".encode(), 1)[1].split(b")", 1)[0]
            assert body.count(b".param .u64") == n_ptr and body.count(b".param .u32") == n_int, body


def test_ptx_disk_cache_round_trip(tmp_path, monkeypatch):
    _compiler_or_skip()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = compile_ptx("8.6")
    cached = list((tmp_path / "trtforge" / "ptx").glob("*-sm_86-*.ptx"))
    assert len(cached) == 1 and cached[0].read_bytes() == first.text
    assert compile_ptx("sm_86") == first


def test_normalize_arch():
    assert normalize_arch("8.0") == "sm_80" and normalize_arch("sm_90") == "sm_90" and normalize_arch("86") == "sm_86"
    with pytest.raises(InputError, match="sm_80"):
        normalize_arch("7.5")


def test_defines_match_spec():
    assert kernel_define("LORA_MAX_RANK") == spec.MAX_RANK
    assert kernel_define("LORA_THREADS") % 64 == 0  # every power-of-two rank <= 64 divides the block


@pytest.mark.parametrize("tokens", [1, 7, 128, 2048, 4099])
@pytest.mark.parametrize("tile", spec.TILE_CHOICES)
def test_plan_launch_covers_the_problem(tokens, tile):
    f = spec.LoraFields(max_rank=16, num_slots=8, in_features=4096, out_features=4000, tile=tile)
    p = plan_launch(f, tokens, "float16", sm_count=132)
    g = kernel_define("LORA_TOKENS")
    threads = kernel_define("LORA_THREADS")
    assert p.kernel == "lora_fused_f16" and p.block == (threads, 1, 1)
    assert p.max_chunks == math.ceil(tokens / g) + min(8, tokens) == max_chunks(tokens, 8)
    assert p.grid == (1 + p.max_chunks * (p.n_hs + p.n_ot), 1, 1)
    # the H slices (rounded to the tile) and O tiles (rounded to 32) cover H and O
    h_slice = math.ceil(math.ceil(4096 / p.n_hs) / tile) * tile
    o_tile = math.ceil(math.ceil(4000 / p.n_ot) / 32) * 32
    assert h_slice * p.n_hs >= 4096 and o_tile * p.n_ot >= 4000
    assert 1 <= p.n_hs <= math.ceil(4096 / tile) and 1 <= p.n_ot <= math.ceil(4000 / threads)
    assert p.shared_bytes <= 48 * 1024 and p.shared_bytes >= 4 * g * tile
    assert p.scratch_bytes == scratch_bytes(tokens, 8, 16, p.n_hs) >= 4 * p.n_hs * tokens * 16
    # about two work blocks per SM once there is enough work, never fewer than one block per chunk and role
    work = p.grid[0] - 1
    assert work >= 2 * p.max_chunks


def test_plan_launch_small_batches_spread_over_sms():
    f = spec.LoraFields(16, 8, 4096, 4096, 128)
    p1 = plan_launch(f, 1, "bfloat16", sm_count=132)
    assert p1.n_hs == 32 and p1.n_ot == 16  # one token: H split in 32 slices, O in 16 tiles
    big = plan_launch(f, 2048, "bfloat16", sm_count=132)
    assert big.n_hs <= 2 and big.n_ot <= 2  # many chunks: little splitting, so little re-reading


def test_plan_launch_refusals_and_args():
    f = spec.LoraFields(8, 4, 64, 32, 64)
    with pytest.raises(InputError, match="dtype"):
        plan_launch(f, 4, "int8")
    with pytest.raises(InputError, match="tile"):
        plan_launch(f, 4, "float32", tile=48)
    p = plan_launch(f, 5, "float32")
    values, types = kernel_args(p, f, x=1, y=2, lora_a=3, lora_b=4, slot_ids=5, scales=6, scratch=7, num_tokens=5,
                                tokens_per_slot=1, meta=8)
    assert len(values) == len(types) == 20
    assert values[:9] == (1, 2, 3, 4, 5, 6, 7, 8, 2)  # out = y: in place
    assert values[9:] == (5, 64, 32, 8, 4, 1, 64, p.n_hs, p.n_ot, p.max_chunks, 0)
    q = plan_launch(f, 5, "float32", sm_count=2, out_of_place=True)
    values, _ = kernel_args(q, f, x=1, y=2, lora_a=3, lora_b=4, slot_ids=5, scales=6, scratch=7, num_tokens=5,
                            tokens_per_slot=1, out=9)
    assert values[8] == 9 and values[-1] == q.n_copy == 2 and q.grid[0] == 1 + q.max_chunks * (q.n_hs + q.n_ot) + 2



def test_plan_simple():
    from trtforge.plugins.lora.launch import plan_simple, simple_args

    f = spec.LoraFields(16, 8, 4096, 4096, 128)
    p = plan_simple(f, 7, "float16")
    # tokens on grid x (up to 2^31 - 1), O tiles on grid y (<= 65535): a 100k-token prefill must be launchable
    assert p.kernel == "lora_simple_f16" and p.grid == (7, 4, 1) and p.block == (256, 1, 1)
    small = plan_simple(spec.LoraFields(8, 2, 64, 100, 32), 3, "float32")
    assert small.grid == (3, 1, 1)
    big = plan_simple(f, 100_000, "float16")
    assert big.grid[0] == 100_000 and big.grid[1] <= 65535
    values, types = simple_args(f, x=1, y=2, lora_a=3, lora_b=4, slot_ids=5, scales=6, out=7, tokens_per_slot=5)
    assert values[7:] == (4096, 4096, 16, 8, 5, 1024) and len(types) == 13


def test_aot_launch_spec():
    """The AOT recipe embeds the Triton small-batch kernel: extra args T, H, O, R, N, tokens_per_slot (issue 17)."""
    pytest.importorskip("triton")
    from trtforge.plugins.lora.aot_plugin import aot_launch_spec

    f = spec.LoraFields(16, 8, 4096, 1024, 128)
    tok = aot_launch_spec(f, 3, 2, "bfloat16", "sm_90")
    assert tok.kernel == "lora_small" and f".entry {tok.kernel}(".encode() in tok.ptx
    assert tok.grid_y == 8 and tok.grid_x == (("x_dim", 0), ("x_dim", 1)) and tok.block_x == 128
    assert tok.extra_args == (("tokens", 0), ("const", 4096), ("const", 1024), ("const", 16), ("const", 8),
                              ("const", 1))
    assert 0 < tok.shared_mem <= 48 * 1024
    seq = aot_launch_spec(f, 3, 1, "float16", "sm_90")
    assert seq.extra_args[5] == ("x_dim", 1)  # per sequence: S tokens share a slot id
    flat = aot_launch_spec(f, 2, 1, "float16", "sm_80")  # same image as test_lora_triton compiles (cached)
    assert flat.grid_x == (("x_dim", 0),) and flat.extra_args[5] == ("const", 1)
    with pytest.raises(ValueError):
        aot_launch_spec(f, 2, 2, "float32", "sm_80")


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
def test_each_compiler_when_available(compiler, tmp_path, monkeypatch):
    from trtforge.build_engine.core.errors import BackendError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    try:
        ptx = compile_ptx("sm_90", compiler=compiler, use_cache=False)
    except BackendError as exc:
        pytest.skip(f"{compiler} not available here: {exc.message[:120]}")
    assert ptx.compiler == compiler and ptx.target == "sm_90"
    assert set(ptx.entries) == set(ENTRY_NAMES.values()) | set(SIMPLE_ENTRY_NAMES.values()) | {PREPARE_ENTRY}


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
def test_cubin_for_the_exact_arch(compiler, tmp_path, monkeypatch):
    """The launcher loads a cubin first (no driver JIT: a compiler newer than the driver still works)."""
    from trtforge.build_engine.core.errors import BackendError
    from trtforge.plugins.lora.ptx import compile_cubin

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    try:
        cubin = compile_cubin("sm_90", compiler=compiler)
    except BackendError as exc:
        pytest.skip(f"{compiler} not available here: {exc.message[:120]}")
    assert cubin.text.startswith(b"\x7fELF") and cubin.compiler == compiler
    for name in (*ENTRY_NAMES.values(), *SIMPLE_ENTRY_NAMES.values()):
        assert name.encode() + b"\0" in cubin.text  # entry symbols in the ELF string table
    assert compile_cubin("sm_90", compiler=compiler).text == cubin.text  # disk cache round trip


def _elf_section_sizes(data: bytes, prefix: str) -> dict[str, int]:
    """Sizes of the ELF64 sections whose names start with ``prefix`` (a cubin's ``.nv.shared.<kernel>``)."""
    import struct

    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = secs[shstrndx][4]
    out = {}
    for sec in secs:
        start = names_at + sec[0]
        name = data[start:data.index(b"\0", start)].decode()
        if name.startswith(prefix):
            out[name] = sec[5]
    return out


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_static_shared_memory_fits_the_plan(arch, tmp_path, monkeypatch):
    """plan_launch's FUSED_STATIC_SHARED covers the cubin's static shared memory (the section also holds the 1 KiB
    the hardware reserves per block), so the largest plan (4096 slots) stays under the 48 KiB default."""
    from trtforge.build_engine.core.errors import BackendError
    from trtforge.plugins.lora.launch import DEFAULT_SHARED_LIMIT, FUSED_STATIC_SHARED
    from trtforge.plugins.lora.ptx import compile_cubin

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    try:
        cubin = compile_cubin(arch)
    except BackendError as exc:
        pytest.skip(f"no compiler here: {exc.message[:120]}")
    sizes = _elf_section_sizes(cubin.text, ".nv.shared.lora_fused_")
    assert set(sizes) == {f".nv.shared.{n}" for n in ENTRY_NAMES.values()}
    reserved = 1024
    for size in sizes.values():
        assert size - reserved <= FUSED_STATIC_SHARED
    big = plan_launch(spec.LoraFields(64, spec.MAX_SLOTS, 4096, 4096, 256), 2048, "float16")
    assert big.shared_bytes + FUSED_STATIC_SHARED <= DEFAULT_SHARED_LIMIT


def test_fused_kernel_stages_x_with_vector_loads(tmp_path, monkeypatch):
    """Issue 17 item 6: the shrink stages x 4 elements per load (8 bytes fp16/bf16, 16 bytes fp32) when aligned."""
    _compiler_or_skip()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ptx = compile_ptx("sm_90").text
    for name, vector_load in (("lora_fused_f16", b"ld.global.v4.u16"), ("lora_fused_bf16", b"ld.global.v4.u16"),
                              ("lora_fused_f32", b"ld.global.v4.f32")):
        body = ptx.split(f".entry {name}(".encode(), 1)[1].split(b".entry", 1)[0]
        assert vector_load in body, name
