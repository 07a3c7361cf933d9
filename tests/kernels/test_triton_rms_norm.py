"""RMSNorm (with and without the fused residual add) against the torch reference."""
from __future__ import annotations

import pytest
import torch
from kernel_test_inputs import assert_close

from kvserve.kernels.rms_norm import rms_norm_torch, rms_norm_triton

EPS = 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 64), (3, 1000), (2, 3, 128)])  # 3-D: per-head q/k norm
def test_rms_norm_matches_reference(device, dtype, shape):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype).to(device)
    weight = (1 + 0.5 * torch.randn(shape[-1], generator=gen)).to(dtype).to(device)
    out = torch.full_like(x, float("nan"))
    assert rms_norm_triton(x, weight, EPS, out=out) is out
    assert_close(out, rms_norm_torch(x, weight, EPS), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_place", [False, True])
def test_fused_residual_matches_reference(device, dtype, in_place):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 300, generator=gen).to(dtype).to(device)
    residual = torch.randn(5, 300, generator=gen).to(dtype).to(device)
    weight = torch.randn(300, generator=gen).to(dtype).to(device)
    ref_out, ref_res = rms_norm_torch(x, weight, EPS, residual)
    out = torch.full_like(x, float("nan"))
    res_out = residual if in_place else torch.full_like(x, float("nan"))
    got_out, got_res = rms_norm_triton(x, weight, EPS, residual, out=out, residual_out=res_out)
    assert got_out is out and got_res is res_out
    assert_close(got_out, ref_out, dtype)
    assert_close(got_res, ref_res, dtype)


def test_float32_weight_promotes_output(device):
    x = torch.randn(4, 96, dtype=torch.bfloat16, device=device)
    weight = torch.randn(96, device=device)
    out = rms_norm_triton(x, weight, EPS)
    ref = rms_norm_torch(x, weight, EPS)
    assert out.dtype == ref.dtype == torch.float32
    assert_close(out, ref, torch.bfloat16)
