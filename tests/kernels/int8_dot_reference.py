"""The arithmetic of kernels/cpu_grid_int8_dot.c in torch, for its tests: 4-bit codes times
activations rounded to int8 per block of 32, summed in float64; and weights in each of its layouts."""
from __future__ import annotations

import torch

from kvserve.backend.models import gguf_codes, grid_weights


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


def int4_weight(n: int, k: int, seed: int):
    """Random int4 codes with bfloat16 scales and zeros (the values `--quantization int4` keeps)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.int32)
    scale = (torch.rand(n, k // 32, generator=g) * 0.02).bfloat16().float()
    zero = (torch.randn(n, k // 32, generator=g) * 0.02).bfloat16().float()
    return codes, scale, zero, grid_weights.int4_strips(codes, scale, zero, grid_weights.INT4_Q8)


def q4_weight(n: int, k: int, seed: int):
    """A float32 weight on GGUF's Q4_1 grid (d * q + m per block of 32, d and m float16 values, every
    block's codes spanning 0..15) with its codes and constants."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.int32)
    codes[:, ::32], codes[:, 1::32] = 0, 15
    d = (torch.rand(n, k // 32, generator=g) * 0.01 + 1e-4).half().float()
    m = (-torch.rand(n, k // 32, generator=g) * 0.08).half().float()
    weight = (codes.view(n, -1, 32) * d[..., None] + m[..., None]).view(n, k)
    return weight, codes, d, m


def int8_dot_strip_kinds(n: int, k: int, seed: int) -> list[tuple[torch.Tensor, int]]:
    """(strips, kind) of [n, k] weights in each of the kernel's layouts: int4's codes (INT4_Q8), a Q4_1
    weight's grid with float32 and with float16 constants (Q4_Q8, Q4H_Q8), a Q8_0 weight's (Q8_Q8), a
    Q6_K-like one's (Q8H_Q8)."""
    *_, int4 = int4_weight(n, k, seed)
    q4 = grid_weights.find_grid(q4_weight(n, k, seed + 1)[0])
    codes8 = torch.randint(-127, 128, (n, k), generator=torch.Generator().manual_seed(seed + 2)).float()
    codes8[:, ::32] = 127
    q8 = grid_weights.find_grid((codes8.view(n, -1, 32) * 0.0078125).view(n, k))
    halves_weight, halves_codes = q8_halves_weight(n, k, seed + 3)
    halves = grid_weights.from_codes(halves_codes, halves_weight)
    return [(int4, grid_weights.INT4_Q8), (q4.strips, grid_weights.Q4_Q8),
            (grid_weights.q4_strips_f16(q4), grid_weights.Q4H_Q8), (q8.strips, grid_weights.Q8_Q8),
            (halves.strips, grid_weights.Q8H_Q8)]


def q8_halves_weight(n: int, k: int, seed: int, low: int = -128,
                     high: int = 128) -> tuple[torch.Tensor, gguf_codes.BlockCodes]:
    """A float32 weight [n, k] of GGUF's Q8_HALVES form (step * q + offset, q in [low, high), step and
    offset float16 values per 16 inputs, as Q5_1's, Q5_K's and Q6_K's blocks give) with its codes."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(low, high, (n, k), generator=g)
    step = (torch.rand(n, k // 16, generator=g) * 0.01 + 1e-4).half().float()
    offset = (torch.randn(n, k // 16, generator=g) * 0.05).half().float()
    weight = q.float() * step.repeat_interleave(16, dim=1) + offset.repeat_interleave(16, dim=1)  # step * q exact
    return weight, gguf_codes.BlockCodes(gguf_codes.Q8_HALVES, q.to(torch.int8).numpy(), step.numpy(), offset.numpy())


def q8_halves_reference(x: torch.Tensor, codes: gguf_codes.BlockCodes) -> torch.Tensor:
    """x [M, K] times a Q8_HALVES weight as the kernel computes it, in float64: per half of a block,
    step * xs * sum(q * xq) + offset * sum(x)."""
    m, k = x.shape
    xq, xs = quantized_activations(x)
    q = torch.from_numpy(codes.codes).double().view(-1, k // 32, 2, 16)
    step = torch.from_numpy(codes.step).double().view(-1, k // 32, 2)
    offset = torch.from_numpy(codes.offset).double().view(-1, k // 32, 2)
    dots = torch.einsum("mghj,nghj->mngh", xq.view(m, k // 32, 2, 16), q)
    sums = x.view(m, k // 32, 2, 16).double().sum(-1)
    return torch.einsum("mngh,ngh,mg->mn", dots, step, xs) + torch.einsum("ngh,mgh->mn", offset, sums)
