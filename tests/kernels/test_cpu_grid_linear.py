"""Grid-coded float32 weights (backend/models/grid_weights.py, kernels/cpu_grid_linear.c).

The codes must give back the float32 weights bit for bit (as the `gguf` package dequantizes
them), a weight on no grid must be declined, and the kernel must be the product with those
exact weights (to float32 summation order)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve.backend.models import grid_weights
from kvserve.backend.models.cpu_linear import NATIVE_MAX_ROWS, PackedLinear
from kvserve.kernels import cpu_native

pytestmark = pytest.mark.skipif(cpu_native.pack_linear(torch.zeros(1, 1)) is None,
                                reason="the native linear kernels do not run here (no compiler or neither AVX-512 nor AVX2 + FMA)")


def _gguf_roundtrip(weight: np.ndarray, kind: str) -> torch.Tensor:
    """`weight` quantized by the gguf package's quantizer (llama.cpp's reference one) and dequantized
    back to float32, as gguf_checkpoint.py loads a GGUF tensor."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    qtype = GGMLQuantizationType[kind]
    return torch.from_numpy(np.ascontiguousarray(dequantize(quantize(weight, qtype), qtype), dtype=np.float32))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a.contiguous().view(torch.int32) == b.contiguous().view(torch.int32)).all())


# Q4_0's and Q5_0's d * q blocks go to 8-bit codes unless every block's codes span 0..15
@pytest.mark.parametrize("kind,bits", [("Q4_1", 4), ("Q8_0", 8), ("Q4_0", 8), ("Q5_0", 8)])
@pytest.mark.parametrize("out_features", [37, 130])  # a partial last strip; more rows than the sample
def test_a_gguf_weight_is_found_on_its_grid_and_given_back_bit_for_bit(kind, bits, out_features):
    rng = np.random.default_rng(out_features)
    weight = _gguf_roundtrip((rng.standard_normal((out_features, 96)) * 0.05).astype(np.float32), kind)
    grid = grid_weights.find_grid(weight)
    assert grid is not None and grid.kind == bits
    assert _same_bits(grid_weights.dequantize(grid), weight)
    # The Q4 codes plus constants are 6 bits a value, the Q8 ones 9: against float32's 32.
    assert grid.strips.numel() <= weight.numel() * (0.75 if bits == 4 else 1.125) + 4 * 96 * 2


def test_types_off_the_grids_are_declined():
    rng = np.random.default_rng(4)
    weight = (rng.standard_normal((100, 64)) * 0.05).astype(np.float32)
    assert grid_weights.find_grid(_gguf_roundtrip(weight, "Q5_1")) is None  # d * q + m with 5-bit q


def test_weights_on_no_grid_are_declined():
    gen = torch.Generator().manual_seed(0)
    assert grid_weights.find_grid(torch.randn(200, 64, generator=gen)) is None  # trained or random float32
    assert grid_weights.find_grid(torch.randn(8, 40, generator=gen)) is None  # inputs not a multiple of 32
    assert grid_weights.find_grid(torch.randn(8, 64, generator=gen).double()) is None
    # On a grid but for one value: the exact check sees it.
    weight = _gguf_roundtrip((np.random.default_rng(1).standard_normal((100, 64)) * 0.05).astype(np.float32), "Q4_1")
    weight[90, 7] = torch.nextafter(weight[90, 7], torch.tensor(1.0))
    assert grid_weights.find_grid(weight) is None


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("rows", [1, 3, 4, 6, 9])  # row passes of 4 and partial ones
def test_grid_kernel_is_the_product_with_the_exact_weights(kind, rows):
    rng = np.random.default_rng(rows)
    weight = _gguf_roundtrip((rng.standard_normal((37, 64)) * 0.05).astype(np.float32), kind)
    grid = grid_weights.find_grid(weight)
    gen = torch.Generator().manual_seed(rows)
    bias = torch.randn(37, generator=gen)
    wide = torch.randn(rows, 70, generator=gen)
    x = wide[:, 3:67]  # rows 70 floats apart: the kernel honours the row stride
    for b in (None, bias):
        got = cpu_native.grid_linear_strips(x, grid.strips, grid.kind, 37, b)
        want = (x.double() @ weight.double().T + (0 if b is None else b.double())).float()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # One-hot rows read single weights out: the values the kernel multiplies are the float32 ones
    # (compared as values: a sum that starts at +0 returns a -0.0 weight as +0.0).
    eye = torch.eye(64)[:rows * 7:7]
    got = cpu_native.grid_linear_strips(eye, grid.strips, grid.kind, 37, None)
    assert torch.equal(got, weight[:, :rows * 7:7].T)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_grid_strips_give_a_row_the_same_bits_whatever_rows_run_beside_it(kind):
    # A speculative step verifies its proposals as extra rows of the same strips: each row must
    # come out as it would alone, so that greedy tokens with and without speculation agree exactly.
    rng = np.random.default_rng(5)
    weight = _gguf_roundtrip((rng.standard_normal((37, 96)) * 0.05).astype(np.float32), kind)
    grid = grid_weights.find_grid(weight)
    x = torch.randn(13, 96, generator=torch.Generator().manual_seed(5))
    alone = torch.cat([cpu_native.grid_linear_strips(x[i:i + 1], grid.strips, grid.kind, 37, None) for i in range(13)])
    for rows in range(2, 14):  # every pass size (4 or 6 rows a call), two full calls and partial last ones
        assert _same_bits(cpu_native.grid_linear_strips(x[:rows], grid.strips, grid.kind, 37, None), alone[:rows])


def test_grid_kernel_declines_what_it_does_not_serve():
    weight = _gguf_roundtrip((np.random.default_rng(2).standard_normal((8, 64)) * 0.05).astype(np.float32), "Q8_0")
    grid = grid_weights.find_grid(weight)
    assert cpu_native.grid_linear_strips(torch.zeros(2, 64, dtype=torch.float64), grid.strips, 8, 8, None) is None
    with pytest.raises(ValueError):
        cpu_native.grid_linear_strips(torch.zeros(2, 32), grid.strips, 8, 8, None)  # a width it was not coded for
    with pytest.raises(ValueError):
        cpu_native.grid_linear_strips(torch.zeros(2, 64), grid.strips, 4, 8, None)  # another code format


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 70])  # partial and several 16-row blocks, > 64 rows
@pytest.mark.parametrize("in_features", [96, 288])  # under AVX2 past 6 rows: one widened chunk, then three
def test_grid_tiles_give_the_float32_kernels_results_bit_for_bit(kind, rows, in_features):
    rng = np.random.default_rng(rows)
    weight = _gguf_roundtrip((rng.standard_normal((37, in_features)) * 0.05).astype(np.float32), kind)
    grid = grid_weights.find_grid(weight)
    gen = torch.Generator().manual_seed(rows)
    bias, x = torch.randn(37, generator=gen), torch.randn(rows, in_features, generator=gen)
    dense = cpu_native.pack_linear(weight)
    for b in (None, bias):
        got = cpu_native.linear_grid(x, grid.tiles, grid.kind, 37, b)
        assert _same_bits(got, cpu_native.linear(x, dense, 37, b))  # same weights, same summation order
        torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, b), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        cpu_native.linear_grid(torch.zeros(2, in_features + 32), grid.tiles, grid.kind, 37, None)  # another width


def test_packed_linear_reads_the_grid_codes_up_to_64_rows(monkeypatch):
    rng = np.random.default_rng(3)
    weight = _gguf_roundtrip((rng.standard_normal((48, 64)) * 0.05).astype(np.float32), "Q4_1")
    layer = PackedLinear(weight, None)
    assert layer.grid is not None and layer.native is None  # the codes instead of the float32 tiles
    strips = layer.strip_max_rows
    assert strips == cpu_native.grid_strip_rows() and strips in (4, 6)  # AVX-512's one call, AVX2's
    calls = []
    for name in ("grid_linear_strips", "linear_grid"):
        real = getattr(cpu_native, name)
        monkeypatch.setattr(cpu_native, name, lambda *a, real=real, name=name: calls.append((name, a[0].shape[0]))
                            or real(*a))
    for rows in (1, strips, strips + 1, NATIVE_MAX_ROWS, NATIVE_MAX_ROWS + 1):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, weight), atol=1e-5, rtol=1e-5)
    assert calls == [("grid_linear_strips", 1), ("grid_linear_strips", strips),
                     ("linear_grid", strips + 1), ("linear_grid", NATIVE_MAX_ROWS)]
    monkeypatch.setenv("KVSERVE_CPU_GRID", "0")
    plain = PackedLinear(weight, None)
    assert plain.grid is None and plain.native is not None
