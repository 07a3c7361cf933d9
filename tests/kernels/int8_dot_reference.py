"""The arithmetic of kernels/cpu_grid_int8_dot.c in torch, for its tests: 4-bit codes times
activations rounded to int8 per block of 32, summed in float64."""
from __future__ import annotations

import torch


def quantized_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes [M, G, 32] as float64, scales [M, G] as float64) of x [M, K], as the kernel
    rounds them: max |x| / 127 per block, codes round(x * (127 / max |x|)) to nearest even."""
    m, k = x.shape
    blocks = x.view(m, k // 32, 32)
    amax = blocks.abs().amax(-1)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    codes = torch.round(blocks * inverse[..., None]).clamp(-128, 127)
    return codes.double(), (amax / 127).double()


def int8_dot_reference(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                       offset: int = 8) -> torch.Tensor:
    """x [M, K] times the 4-bit weight (codes [N, K] in 0..15, scale and zero [N, K / 32]:
    w = (q - offset) * scale + zero; int4's offset is 8, GGUF's Q4 grids' 0) as the kernel computes
    it, in float64: the codes centred on 8 meet the rounded activations, the rest the float32 sums,
    so per block scale * xs * sum((q - 8) * xq) + (zero + (8 - offset) * scale) * sum(x)."""
    m, k = x.shape
    xq, xs = quantized_activations(x)
    zero = zero.double() + (8 - offset) * scale.double()
    q = codes.view(-1, k // 32, 32).double() - 8
    dots = torch.einsum("mgj,ngj->mng", xq, q)
    sums = x.view(m, k // 32, 32).double().sum(-1)
    return (torch.einsum("mng,ng,mg->mn", dots, scale.double(), xs)
            + torch.einsum("ng,mg->mn", zero.double(), sums))
