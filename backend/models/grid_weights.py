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

The K-quants' grids cannot be found from the values (gguf_codes.py says why): for a GGUF file
the loader reads their codes from the blocks, and `from_codes` lays those out, checked against
the weight bit for bit the same way. Q5_1, Q5_K and Q6_K (5- and 6-bit codes, Q6_K's step per
16 inputs) and fused weights of mixed types take a third layout, Q8_HALVES: 8-bit codes with a
step and an offset per 16 inputs.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from kvserve.backend.models import gguf_codes
from kvserve.kernels import cpu_native

Q4, Q8, Q8_HALVES = gguf_codes.Q4, gguf_codes.Q8, gguf_codes.Q8_HALVES  # cpu_grid_linear.c's GRID_*
INT4 = 2  # GRID_I4: `--quantization int4`'s codes, (q - 8) * scale + zero (quantize.py), in Q4's strips
INT4_Q8 = 3  # GRID_I4_Q8: the same codes with bfloat16 constants, times int8 activations (cpu_grid_int8_dot.c)
Q4_Q8 = 5  # GRID_Q4_Q8: Q4's strips as they are, times int8 activations (`--quantization int4` on Q4 grids)
Q4H_Q8 = 6  # GRID_Q4H_Q8: Q4's codes with float16 d and m, times int8 activations (q4_strips_f16)
Q8_Q8 = 9  # GRID_Q8_Q8: Q8's strips as they are, times int8 activations (`--quantization int4` on Q8 grids)
Q8H_Q8 = 17  # GRID_Q8H_Q8: Q8_HALVES's strips as they are, times int8 activations (int4 on Q5_1, Q5_K, Q6_K)
GROUP = 32  # inputs per block: GGUF's Q4_1 / Q8_0 block size (cpu_grid_linear.c's KVSERVE_GRID_GROUP)
STRIP = 4  # outputs per strip (cpu_grid_linear.c's KVSERVE_GRID_OUTS)
_SAMPLE_ROWS = 64
_CHECK_ROWS = 4096  # a multiple of STRIP


class GridWeight(NamedTuple):
    """A weight as the grid kernels read it: codes and block constants, twice laid out."""
    strips: torch.Tensor  # for cpu_grid_linear.c (few rows): uint8 [ceil(N/4)][K/32][block bytes]
    tiles: cpu_native.Int4Weight | None  # for cpu_linear.c's grid formats (more rows); None without it
    kind: int  # Q4 (4-bit d * q + m), Q8 (8-bit d * q), Q8_HALVES (8-bit d * q + m, d and m per 16 inputs)
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


def _strips(codes: torch.Tensor, constants: list[torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """codes [N, G, C] (bytes per output and block) and constants [N, G] -> the kernel's strips: per
    4 outputs and block, their 4 x C code bytes, then each constant for the 4 (as `dtype`)."""
    n, groups = codes.shape[:2]
    pad = -n % STRIP
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad, *codes.shape[1:])])
        constants = [torch.cat([c, c.new_zeros(pad, groups)]) for c in constants]
    strips = (n + pad) // STRIP
    parts = [codes.view(torch.uint8).reshape(strips, STRIP, groups, -1).transpose(1, 2).reshape(strips, groups, -1)]
    for c in constants:
        parts.append(c.to(dtype).reshape(strips, STRIP, groups).transpose(1, 2).contiguous().view(torch.uint8))
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
    return _laid_out(found, q.reshape(n, k), d, m)


def _laid_out(kind: int, codes: torch.Tensor, step: torch.Tensor, offset: torch.Tensor | None) -> GridWeight:
    """codes [N, K] (uint8 0..15 for Q4, int8 otherwise) with their constants ([N, K / 32] each for
    Q4 and Q8, [N, K / 16] for Q8_HALVES) in both kernels' layouts."""
    n, k = codes.shape
    blocks = codes.view(n, k // GROUP, GROUP)
    if kind == Q4:
        strips = _strips(blocks[..., :16] | (blocks[..., 16:] << 4), [step, offset])
    elif kind == Q8:
        strips = _strips(blocks, [step])
    else:  # per strip block: each output's step for its first 16 inputs, for its last 16, then the offsets
        strips = _strips(blocks, [step[:, 0::2], step[:, 1::2], offset[:, 0::2], offset[:, 1::2]])
    tiles = (cpu_native.pack_grid_tiles_halves(codes, step, offset) if kind == Q8_HALVES
             else cpu_native.pack_grid_tiles(codes, step, offset))
    return GridWeight(strips, tiles, kind, n, k)


def int4_strips(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, kind: int = INT4) -> torch.Tensor:
    """`--quantization int4`'s codes [N, K] (0..15) with their scale and zero [N, K / 32] in the
    strips of `kind`, for the few-row steps of that mode: INT4, Q4's layout; INT4_Q8, the same
    codes with bfloat16 constants (the mode's scale and zero are bfloat16 values: exact)."""
    n, k = codes.shape
    blocks = codes.to(torch.uint8).view(n, k // GROUP, GROUP)
    dtype = torch.bfloat16 if kind == INT4_Q8 else torch.float32
    if kind == INT4_Q8 and not all(torch.equal(c.to(dtype).float(), c.float()) for c in (scale, zero)):
        raise ValueError("int4 strips: INT4_Q8 keeps bfloat16 constants, and these are not bfloat16 values")
    return _strips(blocks[..., :16] | (blocks[..., 16:] << 4), [scale, zero], dtype)


def q4_strips_f16(grid: GridWeight) -> torch.Tensor | None:
    """A Q4 grid's strips with d and m as float16 (kind Q4H_Q8: a sixth fewer bytes), or None where
    one of them is not a float16 value (Q4_1's are; Q4_K's products of two scales need not be)."""
    codes, constants = _strip_constants(grid)
    if not all(torch.equal(c.half().float(), c) for c in constants):
        return None
    return _strips(codes.reshape(-1, *codes.shape[2:]), constants, torch.float16)  # codes [N', K/32, 16]


@torch.no_grad()
def from_codes(codes: gguf_codes.BlockCodes, weight: torch.Tensor) -> GridWeight | None:
    """The grid form of a float32 CPU weight [N, K] from the codes its GGUF blocks hold
    (gguf_codes.py), or None if they are not this weight's bit for bit."""
    n, k = weight.shape
    if codes.codes.shape != (n, k) or k % GROUP or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    q = torch.from_numpy(codes.codes)
    step, offset = torch.from_numpy(codes.step), torch.from_numpy(codes.offset)
    kind = codes.kind
    if kind == Q4 and not (bool(((q >= 0) & (q <= 15)).all()) and torch.equal(step[:, 0::2], step[:, 1::2])
                           and torch.equal(offset[:, 0::2], offset[:, 1::2])):
        kind = Q8_HALVES
    if kind == Q4:
        grid = _laid_out(Q4, q.view(torch.uint8), step[:, 0::2].contiguous(), offset[:, 0::2].contiguous())
    elif kind == Q8 and torch.equal(step[:, 0::2], step[:, 1::2]):
        grid = _laid_out(Q8, q, step[:, 0::2].contiguous(), None)
    else:
        grid = _laid_out(Q8_HALVES, q, step, offset)
    # The codes came from a file: the kernels must compute with exactly the loaded weight. Checked
    # a slice of rows at a time (a float64 copy of a large embedding whole would be gigabytes).
    strip_bytes = grid.strips.numel() // ((n + STRIP - 1) // STRIP)
    for start in range(0, n, _CHECK_ROWS):
        rows = min(_CHECK_ROWS, n - start)
        part = grid._replace(strips=grid.strips[start // STRIP * strip_bytes:][:(rows + STRIP - 1) // STRIP * strip_bytes],
                             tiles=None, out_features=rows)
        if not torch.equal(dequantize(part).view(torch.int32), weight[start:start + rows].view(torch.int32)):
            return None
    return grid


def _strip_constants(grid: GridWeight) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(codes [N', K/32, 32 or 16 bytes], constants [N', K/32] each) back out of the strips."""
    groups = grid.in_features // GROUP
    code_bytes = 16 if grid.kind == Q4 else 32
    count = {Q4: 2, Q8: 1, Q8_HALVES: 4}[grid.kind]
    strips = grid.strips.view(-1, groups, STRIP * (code_bytes + 4 * count))
    codes = strips[..., :STRIP * code_bytes].reshape(-1, groups, STRIP, code_bytes).transpose(1, 2)
    consts = strips[..., STRIP * code_bytes:].contiguous().view(torch.float32).reshape(-1, groups, count, STRIP)
    return codes, [consts[:, :, i].transpose(1, 2).reshape(-1, groups) for i in range(count)]


def dequantize_rows(grid: GridWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (int [T]) of the float32 weight, from the strips that hold them: an embedding
    lookup over a tied embedding kept only as its codes."""
    strips = (grid.out_features + STRIP - 1) // STRIP
    flat = ids.reshape(-1).long()
    held = grid.strips.view(strips, -1)[flat // STRIP]  # each row's strip of 4
    part = grid._replace(strips=held.reshape(-1), tiles=None, out_features=held.shape[0] * STRIP)
    rows = dequantize(part).view(-1, STRIP, grid.in_features)
    return rows[torch.arange(flat.numel()), flat % STRIP].view(*ids.shape, grid.in_features)


def dequantize(grid: GridWeight) -> torch.Tensor:
    """The float32 weight [N, K] back from its strips, computed as the kernels do (tests, and
    from_codes' check)."""
    codes, consts = _strip_constants(grid)
    groups = grid.in_features // GROUP
    if grid.kind == Q4:
        # The kernels' FMA rounds d * q + m once; float64 holds it exactly enough for that one rounding.
        q = torch.cat([codes & 0x0F, codes >> 4], dim=-1).reshape(-1, groups, GROUP).double()
        w = (consts[0].double()[..., None] * q + consts[1].double()[..., None]).float()
    elif grid.kind == Q8:
        w = codes.contiguous().view(torch.int8).reshape(-1, groups, GROUP).float() * consts[0][..., None]
    else:
        q = codes.contiguous().view(torch.int8).reshape(-1, groups, 2, GROUP // 2).double()
        d = torch.stack(consts[:2], dim=-1).double()[..., None]
        m = torch.stack(consts[2:], dim=-1).double()[..., None]
        w = (q * d + m).float()
    return w.reshape(-1, grid.in_features)[:grid.out_features]
