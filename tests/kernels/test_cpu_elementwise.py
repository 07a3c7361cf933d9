"""The native CPU RMSNorm, SiLU-and-mul and GeGLU give the torch references' results within float32 rounding."""
from __future__ import annotations

import pytest
import torch

from kernel_test_inputs import assert_close
from kvserve.backend.worker.ops import TorchOps
from kvserve.kernels import cpu_native
from kvserve.kernels.rms_norm import rms_norm_torch
from kvserve.kernels.silu_and_mul import gelu_and_mul_torch, silu_and_mul_torch

pytestmark = pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: the native kernels are not built")


# 1 row (a batch-1 decode), 16 rows, and enough rows that the op runs on every thread.
@pytest.mark.parametrize("rows", [1, 16, 300])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(rows, with_residual):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=gen) * 3
    weight = torch.randn(576, generator=gen)
    residual = torch.randn(rows, 576, generator=gen) if with_residual else None
    got = cpu_native.rms_norm(x, weight, 1e-5, residual)
    want = rms_norm_torch(x, weight, 1e-5, residual)
    if with_residual:
        assert_close(got[0], want[0], torch.float32)
        assert torch.equal(got[1], want[1])  # the sum itself is one rounding either way
        assert_close(residual, want[1] - x, torch.float32)  # the input residual is left as it was
    else:
        assert_close(got, want, torch.float32)


def test_rms_norm_reads_strided_rows():
    """A row-strided view (every other row of a wider buffer) is read in place, not copied."""
    gen = torch.Generator().manual_seed(7)
    wide = torch.randn(8, 1152, generator=gen)
    x, weight = wide[:, :576], torch.randn(576, generator=gen)
    assert_close(cpu_native.rms_norm(x, weight, 1e-6), rms_norm_torch(x, weight, 1e-6), torch.float32)


@pytest.mark.parametrize("rows", [1, 16, 100])
def test_silu_and_mul_matches_reference_over_the_whole_range(rows):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 2 * 1536, generator=gen) * 8
    x[0, :4] = torch.tensor([-200.0, -88.0, 88.0, 200.0])  # beyond exp's float32 range both ways
    assert_close(cpu_native.silu_and_mul(x), silu_and_mul_torch(x), torch.float32)


@pytest.mark.parametrize("rows", [1, 16, 100])
def test_gelu_tanh_and_mul_matches_reference_over_the_whole_range(rows):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 2 * 2048, generator=gen) * 6
    x[0, :6] = torch.tensor([-200.0, -30.0, -9.0, 9.0, 30.0, 200.0])  # where exp(-2u) leaves float32's range
    got = cpu_native.gelu_tanh_and_mul(x)
    assert_close(got, gelu_and_mul_torch(x, "tanh"), torch.float32)
    assert_close(TorchOps().gelu_and_mul(x, "tanh"), got, torch.float32)
    assert torch.equal(TorchOps().gelu_and_mul(x, "none"), gelu_and_mul_torch(x, "none"))  # exact gelu: torch's


def test_unsupported_inputs_keep_the_torch_path():
    """bfloat16, 3-D per-head norms and odd widths are not the kernels' case: TorchOps falls back."""
    ops = TorchOps()
    x16 = torch.randn(4, 64, dtype=torch.bfloat16)
    assert cpu_native.rms_norm(x16, torch.ones(64, dtype=torch.bfloat16), 1e-6) is None
    assert cpu_native.silu_and_mul(torch.randn(4, 7)) is None
    assert cpu_native.gelu_tanh_and_mul(torch.randn(4, 7)) is None
    heads = torch.randn(4, 3, 64)
    assert torch.equal(ops.rms_norm(heads, torch.ones(64), 1e-6), rms_norm_torch(heads, torch.ones(64), 1e-6))
    assert torch.equal(ops.silu_and_mul(x16), silu_and_mul_torch(x16))


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [64, 32])  # whole heads, and a partial rotary dimension
def test_native_rotary_is_the_torch_rotation(is_neox, rotary_dim):
    from kvserve.kernels.rotary import rotate_torch

    gen = torch.Generator().manual_seed(rotary_dim + is_neox)
    qkv = torch.randn(5, 9 * 64 + 2 * 3 * 64, generator=gen)
    q = qkv[:, :9 * 64].view(5, 9, 64)  # strided rows, as the layer's split of the fused projection
    angles = torch.randn(5, rotary_dim // 2, generator=gen)
    cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
    expected = q.clone()
    rotate_torch(expected, None, cos[:, None, :], sin[:, None, :], is_neox)
    assert cpu_native.rotary(q, cos, sin, is_neox)
    torch.testing.assert_close(q, expected, atol=1e-6, rtol=1e-6)


def test_native_rotary_declines_what_it_does_not_serve():
    x, cs = torch.zeros(2, 3, 8, dtype=torch.float64), torch.zeros(2, 4)
    assert not cpu_native.rotary(x, cs, cs, True)
    assert not cpu_native.rotary(torch.zeros(2, 3, 8), torch.zeros(2, 5), torch.zeros(2, 5), True)  # 10 > 8
