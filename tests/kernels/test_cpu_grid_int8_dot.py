"""`--quantization int4`'s kernel with int8 activations (kernels/cpu_grid_int8_dot.c): over int4's
codes and over GGUF's Q4 grid codes it is the product its doc states (activations rounded to int8
per block of 32, the integer sums exact), a row's result depends on nothing beside it, and its
instruction paths give the same bits (VNNI and AVX-512 BW here; AVX2 in test_cpu_vector_isas.py). An
int4 layer keeps a Q4 weight's own codes."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from kvserve.backend.models import grid_weights
from kvserve.backend.models.quantize import Int4Linear, int4_linear
from kvserve.kernels import cpu_native
from tests.kernels.int8_dot_reference import (int4_weight, int8_dot_reference, int8_dot_strip_kinds, q4_weight,
                                              q8_halves_reference, q8_halves_weight, quantized_activations)

pytestmark = pytest.mark.skipif(not cpu_native.int8_dot_available(),
                                reason="no int8 dot kernel here (needs AVX-512 BW or AVX2, and a C compiler)")

_KERNEL = Path(cpu_native.__file__).with_name("cpu_grid_int8_dot.c")


@pytest.mark.parametrize("n,k", [(7, 32), (48, 96), (130, 576)])  # a partial last strip; one block; SmolLM2's width
@pytest.mark.parametrize("m", [1, 2, 3, 4, 6, 9])  # 4 rows a pass on AVX2, 8 on AVX-512: 6 takes two on AVX2, 9 two or three
def test_the_product_is_the_int8_activation_arithmetic(n, k, m):
    codes, scale, zero, strips = int4_weight(n, k, seed=n + k + m)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g) * 3
    x[0, :32] = 0  # an all-zero block: scale 0, codes 0
    bias = torch.randn(n, generator=g)
    got = cpu_native.grid_linear_strips(x, strips, grid_weights.INT4_Q8, n, bias)
    want = int8_dot_reference(x, codes, scale, zero) + bias.double()
    torch.testing.assert_close(got.double(), want, atol=1e-5 * float(want.abs().max()), rtol=0)


@pytest.mark.parametrize("m", [1, 3, 8, 11])
def test_q4_grid_codes_times_int8_activations(m):
    n, k = 37, 192
    weight, codes, d, low = q4_weight(n, k, seed=m)
    grid = grid_weights.find_grid(weight)
    assert grid is not None and grid.kind == grid_weights.Q4
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(9))
    got = cpu_native.grid_linear_strips(x, grid.strips, grid_weights.Q4_Q8, n, None)
    want = int8_dot_reference(x, codes, d, low, offset=0)
    torch.testing.assert_close(got.double(), want, atol=1e-5 * float(want.abs().max()), rtol=0)
    # d and m are float16 values: the strips with float16 constants give the same bits.
    halves = grid_weights.q4_strips_f16(grid)
    assert halves is not None and halves.numel() * 6 == grid.strips.numel() * 5
    assert torch.equal(cpu_native.grid_linear_strips(x, halves, grid_weights.Q4H_Q8, n, None), got)


def test_int4_keeps_a_gguf_weights_own_codes():
    weight, codes, d, low = q4_weight(64, 128, seed=10)
    layer = int4_linear(weight, None)
    # Q4_1's d and m are float16 values: the strips keep them so.
    assert isinstance(layer, Int4Linear) and layer.strip_kind == grid_weights.Q4H_Q8 and layer.native is None
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(layer(x).double(), int8_dot_reference(x, codes, d, low, offset=0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer(x[None]), layer(x)[None])  # any leading shape
    # An offset that is no float16 value (Q4_K's products of two scales can be such) keeps float32 ones.
    wide = (codes.view(64, -1, 32) * d[..., None] + (low * (1 + 2 ** -13))[..., None]).view(64, 128)
    assert int4_linear(wide, None).strip_kind == grid_weights.Q4_Q8
    # An 8-bit grid (Q8_0's d * q) keeps its codes on the exact grid kernels, as without --quantization.
    g = torch.Generator().manual_seed(13)
    q8 = torch.randint(-127, 128, (64, 128), generator=g).float()
    q8[:, ::32] = 127
    q8_weight = (q8.view(64, -1, 32) * (torch.rand(64, 4, 1, generator=g) * 0.01).half().float()).view(64, 128)
    kept = int4_linear(q8_weight, None, few_rows=True)
    assert isinstance(kept, Int4Linear) and kept.strip_kind == grid_weights.Q8_Q8 and kept.grid.kind == grid_weights.Q8
    torch.testing.assert_close(kept(x).double(), _q8_reference(x, q8_weight), atol=1e-5, rtol=1e-5)
    # 8-bit codes with d and m per 16 inputs (Q5_1, Q5_K, Q6_K) keep theirs on the same kernel.
    halves, halves_codes = q8_halves_weight(64, 128, seed=14, low=-32, high=32)  # Q6_K's range
    kept = int4_linear(halves, None, codes=halves_codes)
    assert isinstance(kept, Int4Linear) and kept.strip_kind == grid_weights.Q8H_Q8
    torch.testing.assert_close(kept(x).double(), q8_halves_reference(x, halves_codes), atol=1e-5, rtol=1e-5)
    # A weight on no grid is rounded to int4 as before.
    other = int4_linear(weight * (1 + 2 ** -18), None)
    assert isinstance(other, Int4Linear) and other.strip_kind == grid_weights.INT4_Q8


def _q8_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x times a Q8 grid weight (d * q per block of 32) with x rounded to int8 per block, in float64."""
    xq, xs = quantized_activations(x)
    n, k = weight.shape
    blocks = weight.view(n, k // 32, 32).double()
    d = blocks.abs().amax(-1) / 127  # the steps of weights whose blocks reach +-127
    q = torch.round(blocks / d[..., None])
    return torch.einsum("mgj,ngj,ng,mg->mn", xq, q, d, xs)


@pytest.mark.parametrize("m", [1, 2, 5, 8, 9])
def test_q8_grid_codes_times_int8_activations(m):
    g = torch.Generator().manual_seed(20 + m)
    n, k = 45, 160
    q = torch.randint(-127, 128, (n, k), generator=g).float()
    q[:, ::32] = -127  # every block reaches the end of its range: d = max |w| / 127
    weight = (q.view(n, -1, 32) * (torch.rand(n, k // 32, 1, generator=g) * 0.01 + 1e-4).half().float()).view(n, k)
    grid = grid_weights.find_grid(weight)
    assert grid is not None and grid.kind == grid_weights.Q8
    x = torch.randn(m, k, generator=g)
    got = cpu_native.grid_linear_strips(x, grid.strips, grid_weights.Q8_Q8, n, None)
    want = _q8_reference(x, weight)
    torch.testing.assert_close(got.double(), want, atol=1e-5 * float(want.abs().max()), rtol=0)


@pytest.mark.parametrize("m", [1, 2, 5, 8, 9])
@pytest.mark.parametrize("low,high", [(-128, 128), (0, 32), (-32, 32)])  # every code; Q5's; Q6_K's
def test_q8_halves_codes_times_int8_activations(m, low, high):
    n, k = 41, 192
    weight, codes = q8_halves_weight(n, k, seed=30 + m, low=low, high=high)
    grid = grid_weights.from_codes(codes, weight)
    assert grid is not None and grid.kind == grid_weights.Q8_HALVES
    g = torch.Generator().manual_seed(m)
    x, bias = torch.randn(m, k, generator=g) * 2, torch.randn(n, generator=g)
    x[0, 32:64] = 0
    got = cpu_native.grid_linear_strips(x, grid.strips, grid_weights.Q8H_Q8, n, bias)
    want = q8_halves_reference(x, codes) + bias.double()
    torch.testing.assert_close(got.double(), want, atol=1e-5 * float(want.abs().max()), rtol=0)
    # Against float32 activations (the exact kernel over the same strips), only the rounding of x moved it.
    exact = cpu_native.grid_linear_strips(x, grid.strips, grid_weights.Q8_HALVES, n, bias)
    half_steps = (x.view(m, -1, 32).abs().amax(-1) / 254).repeat_interleave(32, dim=1)
    coded = torch.from_numpy(codes.codes).float().abs() * torch.from_numpy(codes.step).repeat_interleave(16, dim=1)
    assert ((got - exact).abs() <= half_steps @ coded.T * 1.01 + 1e-4).all()


def test_the_rounding_costs_what_8_bit_activations_cost():
    """Against float32 activations (the INT4 strips over the same codes), the error stays inside
    the bound of rounding each activation by half its block's step."""
    n, k = 64, 576
    codes, scale, zero, strips = int4_weight(n, k, seed=3)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(4))
    exact = cpu_native.grid_linear_strips(x, grid_weights.int4_strips(codes, scale, zero), grid_weights.INT4, n, None)
    got = cpu_native.grid_linear_strips(x, strips, grid_weights.INT4_Q8, n, None)
    # Only the codes' term meets the rounded activations (the zero's takes the float32 sum of x).
    coded = ((codes.view(n, -1, 32) - 8) * scale[..., None]).view(n, k)
    half_steps = (x.view(4, -1, 32).abs().amax(-1) / 254).repeat_interleave(32, dim=1)  # [4, k]
    bound = half_steps @ coded.abs().T
    assert ((got - exact).abs() <= bound * 1.01 + 1e-6).all()
    assert (got - exact).abs().max() > 0  # the activations were rounded: not the float32 path


def test_rows_and_threads_do_not_change_the_bits():
    n, k = 96, 192
    _, _, _, strips = int4_weight(n, k, seed=5)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(6))
    together = cpu_native.grid_linear_strips(x, strips, grid_weights.INT4_Q8, n, None)
    alone = torch.cat([cpu_native.grid_linear_strips(x[i:i + 1].clone(), strips, grid_weights.INT4_Q8, n, None)
                       for i in range(5)])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = cpu_native.grid_linear_strips(x, strips, grid_weights.INT4_Q8, n, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, alone) and torch.equal(together, one_thread)


def test_constants_that_are_not_bfloat16_are_refused():
    codes = torch.zeros(4, 32, dtype=torch.int32)
    with pytest.raises(ValueError, match="bfloat16"):
        grid_weights.int4_strips(codes, torch.full((4, 1), 0.1), torch.zeros(4, 1), grid_weights.INT4_Q8)


def _has_vnni() -> bool:
    try:
        return " avx512_vnni " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


@pytest.mark.skipif(shutil.which("cc") is None or not _has_vnni(), reason="compares the VNNI build with the BW one")
def test_the_vnni_and_bw_paths_give_the_same_bits(tmp_path):
    outs = []
    n, k, m = 67, 320, 4
    kinds = int8_dot_strip_kinds(n, k, seed=7)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(8)) * 10
    for name, extra in (("vnni", []), ("bw", ["-mno-avx512vnni"])):
        path = tmp_path / f"{name}.so"
        subprocess.run([shutil.which("cc"), *cpu_native._FLAGS, *extra, "-o", str(path), str(_KERNEL)], check=True,
                       capture_output=True, timeout=120)
        lib = ctypes.CDLL(str(path))
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.kvserve_grid_int8_dot_f32.argtypes = [p, i64, i64, i64, p, ctypes.c_int, i64, p, p, i64, ctypes.c_int]
        out = torch.full((4, m, n), float("nan"))
        for i, (packed, kind) in enumerate(kinds):
            assert lib.kvserve_grid_int8_dot_f32(x.data_ptr(), k, m, k, packed.data_ptr(), kind, n, None,
                                                 out[i].data_ptr(), n, 2) == 0
        outs.append(out.view(torch.int32))
    assert torch.equal(*outs)
