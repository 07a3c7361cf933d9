"""The native float32 linear kernel (kernels/cpu_linear.c) against F.linear."""
from __future__ import annotations

import pytest
import torch

from kvserve.kernels import cpu_native

pytestmark = pytest.mark.skipif(cpu_native.pack_linear(torch.zeros(1, 1)) is None,
                                reason="the native linear kernel does not run here (no compiler or neither AVX-512 nor AVX2 + FMA)")


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 33, 64, 130])  # partial and several 16-row blocks, > 64 rows
@pytest.mark.parametrize("out_features", [37, 96])  # a partial last tile, and whole tiles
def test_native_linear_is_f_linear(rows, out_features):
    gen = torch.Generator().manual_seed(rows * out_features)
    w, b = torch.randn(out_features, 72, generator=gen), torch.randn(out_features, generator=gen)
    wide = torch.randn(rows, 80, generator=gen)
    x = wide[:, 4:76]  # rows 80 floats apart: the kernel honours the row stride
    packed = cpu_native.pack_linear(w)
    for bias in (None, b):
        got = cpu_native.linear(x, packed, out_features, bias)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, w, bias), atol=1e-4, rtol=1e-5)


def test_what_it_does_not_serve_is_declined():
    assert cpu_native.pack_linear(torch.zeros(4, 4, dtype=torch.float64)) is None
    packed = cpu_native.pack_linear(torch.zeros(4, 4))
    assert cpu_native.linear(torch.zeros(2, 4, dtype=torch.float64), packed, 4, None) is None
    assert cpu_native.linear(torch.zeros(4, 2).t(), packed, 4, None) is None  # columns not contiguous
    with pytest.raises(ValueError):
        cpu_native.linear(torch.zeros(2, 5), packed, 4, None)  # a width the weight was not packed for


@pytest.mark.parametrize("rows", [1, 16, 70])
def test_native_int8_linear_is_the_matmul_of_its_dequantized_codes(rows):
    gen = torch.Generator().manual_seed(rows)
    codes = torch.randint(-127, 128, (37, 48), generator=gen, dtype=torch.int8)
    scales, b = torch.rand(37, generator=gen) / 100, torch.randn(37, generator=gen)
    x = torch.randn(rows, 48, generator=gen)
    packed = cpu_native.pack_linear(codes)
    assert packed is not None and packed.dtype == torch.int8
    expected = x.double() @ (codes.double() * scales.double()[:, None]).t() + b.double()
    torch.testing.assert_close(cpu_native.linear(x, packed, 37, b, scales).double(), expected, atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError):
        cpu_native.linear(x, packed, 37, b)  # int8 codes without their scales


@pytest.mark.parametrize("rows", [1, 16, 70])
def test_native_int4_linear_is_the_matmul_of_its_dequantized_codes(rows):
    gen = torch.Generator().manual_seed(rows)
    n, k = 37, 64  # a partial last tile, two groups of 32 inputs
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
    scale, zero, b = torch.rand(n, 2, generator=gen) / 10, torch.randn(n, 2, generator=gen) / 10, torch.randn(n)
    packed = cpu_native.pack_linear_i4(codes, scale, zero)
    assert packed is not None
    weight = (codes.double() - 8).view(n, 2, 32) * scale.double()[..., None] + zero.double()[..., None]
    x = torch.randn(rows, k, generator=gen)
    expected = x.double() @ weight.view(n, k).t() + b.double()
    torch.testing.assert_close(cpu_native.linear_i4(x, packed, n, b).double(), expected, atol=1e-4, rtol=1e-5)
    assert cpu_native.pack_linear_i4(codes[:, :48], scale, zero) is None  # inputs not a multiple of 32
    with pytest.raises(ValueError):
        cpu_native.linear_i4(torch.randn(rows, 96), packed, n, b)  # a width the weight was not packed for


@pytest.mark.parametrize("kind", ["float32", "int8", "int4"])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(kind):
    """Up to 8 rows are read where they lie and more are first copied into 16-row blocks; either
    way each row takes the same FMAs in the same order, so its output has the same bits alone, in a
    few rows or in many (a verified proposal must come out as in a plain step)."""
    gen = torch.Generator().manual_seed(7)
    n, k, total = 37, 64, 40
    wide = torch.randn(total, k + 16, generator=gen)
    x, b = wide[:, 8:8 + k], torch.randn(n, generator=gen)  # rows k + 16 floats apart
    if kind == "float32":
        packed = cpu_native.pack_linear(torch.randn(n, k, generator=gen))
        run = lambda rows: cpu_native.linear(rows, packed, n, b)  # noqa: E731
    elif kind == "int8":
        packed = cpu_native.pack_linear(torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8))
        scales = torch.rand(n, generator=gen) / 100
        run = lambda rows: cpu_native.linear(rows, packed, n, b, scales)  # noqa: E731
    else:
        codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
        packed = cpu_native.pack_linear_i4(codes, torch.rand(n, 2, generator=gen) / 10,
                                           torch.randn(n, 2, generator=gen) / 10)
        run = lambda rows: cpu_native.linear_i4(rows, packed, n, b)  # noqa: E731
    alone = torch.cat([run(x[i:i + 1]) for i in range(total)])
    for m in (2, 5, 8, 9, 16, 17, total):
        assert torch.equal(run(x[:m]), alone[:m]), m
