"""SiLU-and-mul, the gated MLP activation: silu(x[..., :d]) * x[..., d:] (and GeGLU's reference).

In torch this is three passes over memory (slice-silu, multiply, plus the
temporaries); the fused kernel reads the gate/up row once and writes once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.kernels._triton_utils import cdiv, check, check_launch, jit, tl

_BLOCK = 1024


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """Reference and CPU path: x [..., 2d] -> [..., d]."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def gelu_and_mul_torch(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """GeGLU (Gemma's MLP activation), the reference: gelu(x[..., :d]) * x[..., d:]."""
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate=approximate) * x[..., d:]


@jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, d, BLOCK: tl.constexpr):
    """Grid (rows, column blocks). Rounds silu(gate) to the output dtype before
    the product, as the two-op reference does."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def _launch_silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    rows, two_d = x.shape
    d = two_d // 2
    check(two_d % 2 == 0, "last dim of x must be even")
    check(out.shape == (rows, d) and out.dtype == x.dtype, "out must be [rows, d] in x's dtype")
    check(x.stride(-1) == 1 and out.stride(-1) == 1, "x and out need contiguous rows")
    check_launch(_silu_and_mul_kernel, x, out)
    _silu_and_mul_kernel[(rows, cdiv(d, _BLOCK))](x, out, x.stride(0), out.stride(0), d, BLOCK=_BLOCK,
                                                  num_warps=4)


def silu_and_mul_triton(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton version of `silu_and_mul_torch`."""
    d = x.shape[-1] // 2
    if out is None:
        out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    x2 = x.reshape(-1, x.shape[-1])
    out2 = out.view(-1, d)
    if x2.shape[0] > 0 and d > 0:
        _launch_silu_and_mul(x2, out2)
    return out
