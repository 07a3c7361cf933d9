"""The native kernels' two vector builds (kernels/cpu_vec16.h: AVX-512, and AVX2 + FMA + F16C) give
the same results bit for bit: the linear tiles of every weight format, the grid strips (float32 and
int8 activations), the paged decode attention over every cache format, and the cache widening.

Both builds are compiled here from the same sources (the AVX2 one with -march=x86-64-v3) and run
on the same inputs, so this runs only on a machine with AVX-512 and a C compiler."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from kvserve.kernels import cpu_native
from tests.kernels.int8_dot_reference import int8_dot_strip_kinds

_COMPILER = shutil.which("cc") or shutil.which("gcc")


def _has_avx512() -> bool:
    try:
        return " avx512f " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(_COMPILER is None or not _has_avx512(),
                                reason="compares the AVX-512 build with the AVX2 one: needs AVX-512 and a C compiler")

p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{isa: library}: -march=native (AVX-512 here) and -march=x86-64-v3 (AVX2, FMA, F16C)."""
    out = {}
    for isa, march in (("avx512", "-march=native"), ("avx2", "-march=x86-64-v3")):
        path = tmp_path_factory.mktemp(isa) / "kernels.so"
        flags = [flag for flag in cpu_native._FLAGS if flag != "-march=native"]
        subprocess.run([_COMPILER, *flags, march, "-o", str(path), *map(str, cpu_native._SOURCES), "-lm"],
                       check=True, capture_output=True, timeout=300)
        lib = ctypes.CDLL(str(path))
        lib.kvserve_linear_f32.argtypes = [p, i64, i64, i64, p, i64, p, p, i64, i32]
        lib.kvserve_linear_i8_f32.argtypes = [p, i64, i64, i64, p, p, i64, p, p, i64, i32]
        lib.kvserve_linear_grouped_f32.argtypes = [p, i64, i64, i64, p, i32, p, p, i64, p, p, i64, i32]
        lib.kvserve_grid_linear_f32.argtypes = [p, i64, i64, i64, p, i32, i64, p, p, i64, i32]
        lib.kvserve_grid_int8_dot_f32.argtypes = [p, i64, i64, i64, p, i32, i64, p, p, i64, i32]
        lib.kvserve_paged_decode.argtypes = [p, p, p, i32, p, p, i64, p, p, i64, i64, i64, i64, i64, i64, f32, i32]
        lib.kvserve_kv_to_f32.argtypes = [p, i32, p, i64, p]
        lib.kvserve_kv_to_f32.restype = None
        out[isa] = lib
    return out


def _both(builds, call, shape) -> None:
    """call(lib, out) on each build; the two outputs must be the same bits."""
    outs = []
    for lib in builds.values():
        out = torch.full(shape, float("nan"))
        assert call(lib, out) == 0
        outs.append(out.view(torch.int32))
    assert torch.equal(*outs)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@pytest.mark.parametrize("m", [1, 3, 5, 16, 17, 70])
@pytest.mark.parametrize("n,k", [(45, 96), (64, 128)])
@pytest.mark.parametrize("fmt", ["f32", "i8", 2, 3, 4, 5])  # cpu_linear.c's W_I4, W_G4, W_G8, W_G8H
def test_linear_tiles(builds, m, n, k, fmt):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    tiles = (n + 15) // 16
    x = torch.randn(m, k, generator=g)
    bias = torch.randn(n, generator=g)
    weight = torch.randn(tiles * k * 16, generator=g)
    codes = torch.randint(0, 256, (tiles * k * 16,), dtype=torch.uint8, generator=g)
    scales, zeros = torch.randn(tiles * k * 16, generator=g), torch.randn(tiles * k * 16, generator=g)
    if fmt == "f32":
        def call(lib, out):
            return lib.kvserve_linear_f32(x.data_ptr(), k, m, k, weight.data_ptr(), n, bias.data_ptr(), out.data_ptr(),
                                          n, 2)
    elif fmt == "i8":
        def call(lib, out):
            return lib.kvserve_linear_i8_f32(x.data_ptr(), k, m, k, codes.data_ptr(), scales.data_ptr(), n,
                                             bias.data_ptr(), out.data_ptr(), n, 2)
    else:
        def call(lib, out):
            return lib.kvserve_linear_grouped_f32(x.data_ptr(), k, m, k, codes.data_ptr(), fmt, scales.data_ptr(),
                                                  None if fmt == 4 else zeros.data_ptr(), n, bias.data_ptr(),
                                                  out.data_ptr(), n, 2)
    _both(builds, call, (m, n))


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("bits,block_bytes", [(2, 96), (4, 96), (8, 144), (16, 192)])
def test_grid_strips(builds, m, bits, block_bytes):
    g = torch.Generator().manual_seed(m + bits)
    n, k = 37, 128
    x, bias = torch.randn(m, k, generator=g), torch.randn(n, generator=g)
    # float32 words throughout: the constants are sane values, the codes arbitrary bytes
    packed = torch.randn((n + 3) // 4 * (k // 32) * block_bytes // 4, generator=g)
    _both(builds, lambda lib, out: lib.kvserve_grid_linear_f32(x.data_ptr(), k, m, k, packed.data_ptr(), bits, n,
                                                               bias.data_ptr(), out.data_ptr(), n, 2), (m, n))


@pytest.mark.parametrize("m", [1, 3, 4, 5, 8, 9, 17])  # AVX2 passes 4 rows at a time, AVX-512 8
def test_int8_dot_strips(builds, m):
    n, k = 37, 160
    g = torch.Generator().manual_seed(m)
    x, bias = torch.randn(m, k, generator=g) * 4, torch.randn(n, generator=g)
    x[0, :32] = 0  # a block of zeros: scale 0
    for strips, kind in int8_dot_strip_kinds(n, k, seed=m):
        _both(builds, lambda lib, out: lib.kvserve_grid_int8_dot_f32(x.data_ptr(), k, m, k, strips.data_ptr(), kind, n,
                                                                     bias.data_ptr(), out.data_ptr(), n, 2), (m, n))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", [(9, 3, 64, 16), (8, 8, 128, 16), (8, 4, 128, 32),
                                                                (8, 2, 256, 16), (4, 1, 256, 16)])
@pytest.mark.parametrize("window", [0, 50])
def test_paged_decode_and_widening(builds, dtype, heads, kv_heads, head_dim, block_size, window):
    g = torch.Generator().manual_seed(heads * head_dim + block_size)
    # rows 0-2: one request verifying proposals (one table; attended together without a window)
    lens = torch.tensor([300, 301, 317, 77, 129], dtype=torch.int32)
    per = (int(lens.max()) + block_size - 1) // block_size
    blocks = 3 * per + 1
    key = torch.randn(blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    value = torch.randn(blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    tables = (torch.randperm(blocks - 1, generator=g)[:3 * per] + 1).to(torch.int32).view(3, per)[[0, 0, 0, 1, 2]]
    query = torch.randn(len(lens), heads, head_dim, generator=g)
    fmt, values = cpu_native._KV_FORMATS[dtype], cpu_native._kv_values(dtype)
    for rows in (len(lens), 1):  # one row: its context split into partitions over the threads
        _both(builds, lambda lib, out: lib.kvserve_paged_decode(
            query.data_ptr(), key.data_ptr(), value.data_ptr(), fmt, values, tables.data_ptr(), per, lens.data_ptr(),
            out.data_ptr(), rows, heads, kv_heads, head_dim, block_size, window, head_dim ** -0.5, 2),
            (rows, *query.shape[1:]))

    def widen(lib, out):
        lib.kvserve_kv_to_f32(key.data_ptr(), fmt, values, out.numel(), out.data_ptr())
        return 0
    _both(builds, widen, (1000,))
