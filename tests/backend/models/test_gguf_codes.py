"""A GGUF tensor's own codes (backend/models/gguf_codes.py) laid out for the CPU's grid kernels
(grid_weights.from_codes): every block type the loader serves from codes gives back its float32
dequantization bit for bit, both kernels multiply with exactly those weights, and codes that are
not the weight's are declined."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve.backend.models import grid_weights
from kvserve.backend.models.cpu_linear import CodedEmbedding
from kvserve.backend.models.gguf_codes import Q4, Q8, Q8_HALVES, block_codes, fuse
from kvserve.kernels import cpu_native
from tests.backend.models.gguf_writer import quantized_blocks

pytestmark = pytest.mark.skipif(cpu_native.pack_linear(torch.zeros(1, 1)) is None,
                                reason="the native linear kernels do not run here (no compiler or neither AVX-512 nor AVX2 + FMA)")

KINDS = {"Q8_0": Q8, "Q4_0": Q8, "Q5_0": Q8, "Q4_1": Q4, "Q4_K": Q4, "Q5_1": Q8_HALVES, "Q5_K": Q8_HALVES,
         "Q6_K": Q8_HALVES}
OUT, IN = 37, 256  # a partial last strip and tile; one K-quant block per row


def _tensor(kind: str, seed: int = 0, rows: int = OUT) -> tuple[np.ndarray, np.ndarray]:
    """(blocks, float32 values) of a random weight of block type `kind`, as the loader reads them."""
    from gguf.quants import dequantize
    rng = np.random.default_rng(seed)
    blocks, qtype = quantized_blocks((rng.standard_normal((rows, IN)) * 0.05).astype(np.float32), kind, rng)
    return blocks, np.ascontiguousarray(dequantize(blocks, qtype), dtype=np.float32).reshape(rows, IN)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_block_type_is_laid_out_from_its_codes_bit_for_bit(kind):
    blocks, values = _tensor(kind)
    codes = block_codes(kind, blocks, values)
    assert codes is not None and codes.kind == KINDS[kind]
    weight = torch.from_numpy(values)
    grid = grid_weights.from_codes(codes, weight)
    assert grid is not None and grid.kind == KINDS[kind]
    assert _same_bits(grid_weights.dequantize(grid), weight)
    # Fewer bytes than float32's 4 a value: 0.75 for 4-bit codes, 1.125 and 1.5 for 8-bit ones.
    assert grid.strips.numel() <= weight.numel() * {Q4: 0.75, Q8: 1.125, Q8_HALVES: 1.5}[grid.kind] + 4 * IN * 2


@pytest.mark.parametrize("kind", ["Q6_K", "Q5_K", "Q5_1", "Q4_K"])
@pytest.mark.parametrize("rows", [1, 3, 6])
def test_the_strips_multiply_with_the_exact_weights(kind, rows):
    blocks, values = _tensor(kind, seed=rows)
    weight = torch.from_numpy(values)
    grid = grid_weights.from_codes(block_codes(kind, blocks, values), weight)
    gen = torch.Generator().manual_seed(rows)
    bias = torch.randn(OUT, generator=gen)
    x = torch.randn(rows, IN + 5, generator=gen)[:, 2:IN + 2]  # a row stride that is not the width
    for b in (None, bias):
        got = cpu_native.grid_linear_strips(x, grid.strips, grid.kind, OUT, b)
        want = x.double() @ weight.double().T + (0 if b is None else b.double())
        # float32 summation error, against the sum of magnitudes (random K-quant blocks cancel a lot)
        bound = 1e-6 * (x.double().abs() @ weight.double().abs().T + 1)
        assert bool(((got.double() - want).abs() <= bound).all())
    # One-hot rows read single weights out: the kernel's values are the float32 ones (as values:
    # a sum from +0 gives a -0.0 weight back as +0.0). Columns 8 and 24: both halves of a block.
    eye = torch.eye(IN)[[8, 24, 200][:rows]]
    assert torch.equal(cpu_native.grid_linear_strips(eye, grid.strips, grid.kind, OUT, None),
                       weight[:, [8, 24, 200][:rows]].T)


@pytest.mark.parametrize("kind", ["Q6_K", "Q5_1", "Q4_K"])
@pytest.mark.parametrize("rows", [7, 16, 17, 70])
def test_the_tiles_give_the_float32_kernels_results_bit_for_bit(kind, rows):
    blocks, values = _tensor(kind, seed=rows)
    weight = torch.from_numpy(values)
    grid = grid_weights.from_codes(block_codes(kind, blocks, values), weight)
    gen = torch.Generator().manual_seed(rows)
    bias, x = torch.randn(OUT, generator=gen), torch.randn(rows, IN, generator=gen)
    dense = cpu_native.pack_linear(weight)
    for b in (None, bias):
        got = cpu_native.linear_grid(x, grid.tiles, grid.kind, OUT, b)
        assert _same_bits(got, cpu_native.linear(x, dense, OUT, b))  # same weights, same summation order


def test_a_fused_weight_of_two_types_takes_the_halves_layout():
    # Q4_K_M files put q and k in Q4_K and v in Q6_K: one fused qkv_proj.
    (kb, kv), (vb, vv) = _tensor("Q4_K", seed=1, rows=16), _tensor("Q6_K", seed=2, rows=21)
    codes = fuse([block_codes("Q4_K", kb, kv), block_codes("Q6_K", vb, vv)])
    weight = torch.from_numpy(np.concatenate([kv, vv]))
    grid = grid_weights.from_codes(codes, weight)
    assert codes.kind == Q8_HALVES and grid is not None and _same_bits(grid_weights.dequantize(grid), weight)


def test_codes_that_are_not_the_weights_are_declined():
    blocks, values = _tensor("Q6_K", seed=5)
    codes = block_codes("Q6_K", blocks, values)
    weight = torch.from_numpy(values.copy())
    weight[30, 100] = torch.nextafter(weight[30, 100], torch.tensor(1.0))
    assert grid_weights.from_codes(codes, weight) is None  # one value off: the check sees it
    assert grid_weights.from_codes(codes, weight[:, :128]) is None  # another shape
    assert block_codes("F32", values, values) is None and block_codes("Q3_K", *_tensor("Q3_K")) is None


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K", "Q6_K"])
def test_rows_read_from_the_codes_are_the_weights_rows(kind):
    # A tied embedding kept only as codes (cpu_linear.CodedEmbedding): any ids, any shape, repeats.
    blocks, values = _tensor(kind, seed=9)
    weight = torch.from_numpy(values)
    grid = grid_weights.from_codes(block_codes(kind, blocks, values), weight)
    ids = torch.tensor([[0, 36, 5], [5, 17, 3]])
    assert _same_bits(grid_weights.dequantize_rows(grid, ids), weight[ids])
    # The native expansion the lookup runs (kernels/cpu_grid_linear.c), and the module itself.
    assert _same_bits(cpu_native.grid_rows(grid.strips, grid.kind, ids, OUT, IN), weight[ids])
    assert _same_bits(CodedEmbedding(grid)(ids), weight[ids])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        cpu_native.grid_rows(grid.strips, grid.kind, torch.tensor([OUT]), OUT, IN)
