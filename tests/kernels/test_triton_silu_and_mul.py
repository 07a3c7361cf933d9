"""Fused SiLU-and-mul against the torch reference."""
from __future__ import annotations

import pytest
import torch
from kernel_test_inputs import assert_close

from kvserve.kernels.silu_and_mul import silu_and_mul_torch, silu_and_mul_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 2 * 1500), (2, 3, 2 * 64)])
def test_silu_and_mul_matches_reference(device, dtype, shape):
    x = (3 * torch.randn(shape, generator=torch.Generator().manual_seed(0))).to(dtype).to(device)
    out = torch.full((*shape[:-1], shape[-1] // 2), float("nan"), dtype=dtype, device=device)
    assert silu_and_mul_triton(x, out=out) is out
    assert_close(out, silu_and_mul_torch(x), dtype)
