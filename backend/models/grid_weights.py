"""Find the block grid a float32 weight's values lie on, and keep the weight as its codes.

A checkpoint quantized by llama.cpp and loaded as float32 (gguf_checkpoint.py dequantizes
it with the `gguf` package) holds values on a grid per block of 32 inputs: Q4_1's
d * q + m (q in 0..15), and Q8_0's, Q4_0's and Q5_0's d * q (q in -127..127, -8..7,
-16..15; the 4- and 5-bit ones are kept as 8-bit codes here), d and m float16. Those
codes say exactly what the float32 values say in a fifth of the bytes, and a decode
step at a few rows is bound by the bytes it reads; kernels/cpu_grid_linear.c expands
them in registers.

`find_grid` is not a quantizer: it keeps a weight only if every value reproduces bit for
bit from its codes, computed as numpy does it (d * q, then + m), and returns None
otherwise (random or trained float32 weights, the other GGUF types). It tries float16
steps near (max - min) / 15, and max|w| / 127, / 8 and / 16, per block; a first sample of rows rejects a weight
that is not on a grid before the whole is checked.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from kvserve.kernels import cpu_native

GROUP = 32  # inputs per block: GGUF's Q4_1 / Q8_0 block size (cpu_grid_linear.c's KVSERVE_GRID_GROUP)
STRIP = 4  # outputs per strip (cpu_grid_linear.c's KVSERVE_GRID_OUTS)
_SAMPLE_ROWS = 64


class GridWeight(NamedTuple):
    """A weight as the grid kernels read it: `bits`-bit codes and block constants, twice laid out."""
    strips: torch.Tensor  # for cpu_grid_linear.c (few rows): uint8 [ceil(N/4)][K/32][block bytes]
    tiles: cpu_native.Int4Weight | None  # for cpu_linear.c's grid formats (more rows); None without it
    bits: int  # 4 (d * q + m) or 8 (d * q)
    out_features: int
    in_features: int


def _steps(estimate: torch.Tensor) -> list[torch.Tensor]:
    """Candidate steps for each block: the float16 values nearest `estimate` (>= 0), as float32."""
    half = estimate.to(torch.float16)
    code = half.view(torch.int16)
    return [half.float(), (code + 1).view(torch.float16).float(), (code - 1).view(torch.float16).float()]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.view(torch.int32) == b.view(torch.int32)).all(dim=-1, keepdim=True)


def _affine4(blocks: torch.Tensor):
    """(codes uint8 [N, G, 32], d [N, G], m [N, G]) if every block is d * q + m with q in 0..15, else None."""
    low, high = blocks.amin(dim=-1, keepdim=True), blocks.amax(dim=-1, keepdim=True)
    found = torch.zeros_like(low, dtype=torch.bool)
    step, codes = torch.zeros_like(low), torch.zeros_like(blocks, dtype=torch.uint8)
    for d in _steps((high - low) / 15):
        # The kernel builds d * q + m with one FMA: equal to numpy's two roundings only where
        # d * q is exact, that is where d's significand leaves 4 bits free (float16 steps do).
        exact = (d.view(torch.int32) & 0xF) == 0
        q = torch.where(d > 0, (blocks - low) / d, 0.0).round_().clamp_(0, 15)
        ok = _same_bits(d * q + low, blocks) & exact & ~found
        step = torch.where(ok, d, step)
        codes = torch.where(ok, q.to(torch.uint8), codes)
        found |= ok
        if bool(found.all()):
            return codes, step.squeeze(-1), low.squeeze(-1)
    return None


# The largest code magnitude of each symmetric GGUF type: Q8_0 (q in -127..127), Q4_0 (-8..7),
# Q5_0 (-16..15); the quantizers give it to the block's largest value, so max|w| / it is |d|.
_SYMMETRIC_TOPS = (127, 8, 16)


def _symmetric8(blocks: torch.Tensor):
    """(codes int8 [N, G, 32], d [N, G]) if every block is d * q with q in -127..127, else None
    (Q4_0 and Q5_0 blocks too: their d * (q - 8) and d * (q - 16) are such products)."""
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    found = torch.zeros_like(amax, dtype=torch.bool)
    step, codes = torch.zeros_like(amax), torch.zeros_like(blocks, dtype=torch.int8)
    # Both signs of each step: numpy's d * q keeps the sign of d on a zero code (-0.0 where d < 0),
    # and the kernel computes the same product from an integer code.
    for d in (sign * d for top in _SYMMETRIC_TOPS for d in _steps(amax / top) for sign in (1, -1)):
        q = torch.where(d != 0, blocks / d, 0.0).round_().clamp_(-127, 127).to(torch.int8).float()
        ok = _same_bits(q * d, blocks) & ~found
        step = torch.where(ok, d, step)
        codes = torch.where(ok, q.to(torch.int8), codes)
        found |= ok
        if bool(found.all()):
            return codes, step.squeeze(-1)
    return None


def _strips(codes: torch.Tensor, constants: list[torch.Tensor]) -> torch.Tensor:
    """codes [N, G, C] (bytes per output and block) and float32 constants [N, G] -> the kernel's
    strips: per 4 outputs and block, their 4 x C code bytes, then each constant for the 4."""
    n, groups = codes.shape[:2]
    pad = -n % STRIP
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad, *codes.shape[1:])])
        constants = [torch.cat([c, c.new_zeros(pad, groups)]) for c in constants]
    strips = (n + pad) // STRIP
    parts = [codes.view(torch.uint8).reshape(strips, STRIP, groups, -1).transpose(1, 2).reshape(strips, groups, -1)]
    for c in constants:
        parts.append(c.float().reshape(strips, STRIP, groups).transpose(1, 2).contiguous().view(torch.uint8))
    return torch.cat(parts, dim=-1).contiguous().reshape(-1)


def _encode(blocks: torch.Tensor, bits: tuple[int, ...] = (4, 8)):
    """(bits, codes [N, G, 32], d [N, G], m [N, G] or None) of the first grid in `bits` every block is on, else None."""
    affine = _affine4(blocks) if 4 in bits else None
    if affine is not None:
        return (4, *affine)
    symmetric = _symmetric8(blocks) if 8 in bits else None
    if symmetric is not None:
        return (8, *symmetric, None)
    return None


@torch.no_grad()
def find_grid(weight: torch.Tensor) -> GridWeight | None:
    """The grid-coded form of a float32 CPU weight [N, K] whose every value lies on a Q4_1- or
    Q8_0-style block grid (bit for bit), else None."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.shape[1] % GROUP:
        return None
    n, k = weight.shape
    blocks = weight.detach().contiguous().view(n, k // GROUP, GROUP)
    bits: tuple[int, ...] = (4, 8)
    if n > _SAMPLE_ROWS:
        # Most weights are on no grid: say so after a sample, not the whole; and check the whole
        # for the grid the sample is on first. (A Q4_0 block whose codes reach both 0 and 15 is
        # on the 4-bit grid too, but its weight's other blocks may not be: then the 8-bit one.)
        sample = _encode(blocks[:_SAMPLE_ROWS])
        if sample is None:
            return None
        bits = (sample[0], *(b for b in bits if b != sample[0]))
    encoded = _encode(blocks, bits)
    if encoded is None:
        return None
    found, q, d, m = encoded
    if found == 4:
        strips = _strips(q[..., :16] | (q[..., 16:] << 4), [d, m])
    else:
        strips = _strips(q, [d])
    tiles = cpu_native.pack_grid_tiles(q.reshape(n, k), d, m)
    return GridWeight(strips, tiles, found, n, k)


def dequantize(grid: GridWeight) -> torch.Tensor:
    """The float32 weight [N, K] back from its strips, computed as numpy's dequantization does (tests)."""
    groups = grid.in_features // GROUP
    code_bytes = 16 if grid.bits == 4 else 32
    strips = grid.strips.view(-1, groups, STRIP * code_bytes + STRIP * 4 * (2 if grid.bits == 4 else 1))
    codes = strips[..., :STRIP * code_bytes].reshape(-1, groups, STRIP, code_bytes).transpose(1, 2)
    consts = strips[..., STRIP * code_bytes:].contiguous().view(torch.float32).reshape(-1, groups, 2 if grid.bits == 4 else 1, STRIP)
    d = consts[:, :, 0].transpose(1, 2).reshape(-1, groups, 1)
    if grid.bits == 4:
        q = torch.cat([codes & 0x0F, codes >> 4], dim=-1).reshape(-1, groups, GROUP).float()
        w = d * q + consts[:, :, 1].transpose(1, 2).reshape(-1, groups, 1)
    else:
        w = codes.contiguous().view(torch.int8).reshape(-1, groups, GROUP).float() * d
    return w.reshape(-1, grid.in_features)[:grid.out_features]
