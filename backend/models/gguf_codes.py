"""A GGUF tensor's codes and block constants, read from its blocks, beside its float32 values.

The loader dequantizes every GGUF tensor to float32 (gguf_checkpoint.py). The CPU's grid
kernels (kernels/cpu_grid_linear.c, cpu_linear.c) read a weight as its codes instead, and
grid_weights.py can find the codes of Q4_0/Q4_1/Q5_0/Q8_0 values from the values alone. The
K-quants cannot be found that way: a Q4_K or Q5_K sub-block's step is a float16 times a 6-bit
scale and its codes need not reach 0 or the top, and a Q6_K block has a step per 16 inputs. So
for GGUF files the constants come from the blocks themselves, as numpy computes them in the
`gguf` package's dequantization, and the codes from the values: q = round((v - offset) / step).

Every block type is put as: per 16 inputs a float32 `step` and `offset`, per input an 8-bit
code, value = step * q + offset in one rounding (the kernels' FMA). That equals numpy's
step * q then + offset because step * q is exact for every type here (a float16 times at most
7 bits of scale times at most 6 bits of code fits float32's 24). Symmetric types take offset
-0.0, which keeps numpy's signed zeros (d * 0 with d < 0 is -0.0). grid_weights.from_codes checks
that every value reproduces bit for bit and declines otherwise, so a surprise in a file costs
speed (the float32 path), never a changed weight.

`kind` says which kernel layout suits the type: Q4 (4-bit codes, step and offset per 32
inputs: Q4_1, Q4_K), Q8 (8-bit codes times a step per 32 inputs, no offset: Q8_0, Q4_0, Q5_0)
or Q8_HALVES (8-bit codes, step and offset per 16 inputs: Q5_1, Q5_K, Q6_K, and any fused
weight whose parts differ). numpy only: the gateway's GGUF reading imports nothing heavier.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

HALF = 16  # inputs per step and offset in this form (Q6_K's sub-block, half of every other type's)
CODES_PER_STEP = HALF  # the public name: a cut between inputs keeps the codes only at a multiple of it
Q4, Q8, Q8_HALVES = 4, 8, 16  # grid_weights.py's kinds


class BlockCodes(NamedTuple):
    """A weight [N, K] as value = step * code + offset, step and offset per 16 inputs."""
    kind: int  # Q4, Q8 or Q8_HALVES: the layout it fits
    codes: np.ndarray  # int8 [N, K]
    step: np.ndarray  # float32 [N, K / 16]
    offset: np.ndarray  # float32 [N, K / 16]

    def rows(self, reorder: Callable[[np.ndarray], np.ndarray]) -> BlockCodes:
        """The same codes with rows moved by `reorder` (llama's q/k un-permutation)."""
        return BlockCodes(self.kind, reorder(self.codes), reorder(self.step), reorder(self.offset))


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block, as float32 [rows, blocks]."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's (step, offset) per 32 inputs: d * scale and -(dmin * min), as gguf computes them."""
    from gguf.quants import Q4_K
    rows, count = blocks.shape[:2]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mins = Q4_K.get_scale_min(np.ascontiguousarray(blocks[..., 4:16]).reshape(rows * count, 12))
    step = d[..., None] * sc.reshape(rows, count, 8).astype(np.float32)
    offset = -(dmin[..., None] * mins.reshape(rows, count, 8).astype(np.float32))
    return step.reshape(rows, -1), offset.reshape(rows, -1)


def _constants(type_name: str, blocks: np.ndarray) -> tuple[int, np.ndarray, np.ndarray, int] | None:
    """(kind, step, offset, inputs per constant) of a block type, or None for one not handled."""
    symmetric = np.float32(-0.0)
    if type_name in ("Q8_0", "Q4_0", "Q5_0"):
        d = _f16(blocks, 0)
        return Q8, d, np.full_like(d, symmetric), 32
    if type_name in ("Q4_1", "Q5_1"):
        return (Q4 if type_name == "Q4_1" else Q8_HALVES), _f16(blocks, 0), _f16(blocks, 2), 32
    if type_name in ("Q4_K", "Q5_K"):
        return (Q4 if type_name == "Q4_K" else Q8_HALVES), *_k_scales(blocks), 32
    if type_name == "Q6_K":
        step = _f16(blocks, 208)[..., None] * blocks[..., 192:208].view(np.int8).astype(np.float32)
        step = step.reshape(blocks.shape[0], -1)
        return Q8_HALVES, step, np.full_like(step, symmetric), 16
    return None


def block_codes(type_name: str, raw: np.ndarray, values: np.ndarray) -> BlockCodes | None:
    """The codes of a GGUF tensor of block type `type_name`: `raw` its blocks (uint8 [N, bytes per
    row], as gguf's reader holds them), `values` its float32 dequantization [N, K]. None for a type
    with no codes here (F32, F16, Q2_K, Q3_K). Not checked here: grid_weights.from_codes checks the
    laid-out codes against the weight, bit for bit, where they are used."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    if type_name not in GGMLQuantizationType.__members__ or values.ndim != 2 or raw.ndim != 2:
        return None
    per_block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    rows, k = values.shape
    if raw.shape != (rows, k // per_block * block_bytes) or k % per_block:
        return None
    found = _constants(type_name, raw.reshape(rows, k // per_block, block_bytes))
    if found is None:
        return None
    kind, step, offset, per_constant = found
    repeat = per_constant // HALF
    step, offset = (np.ascontiguousarray(np.repeat(c, repeat, axis=1), dtype=np.float32) for c in (step, offset))
    wide_step = np.repeat(step, HALF, axis=1)
    # A zero step (a sub-block scale of 0) still signs numpy's zeros: d * q is -0.0 where the
    # signs of d and q differ, and code -1 is what gives -0.0 back (0 gives +0.0).
    signed_zero = np.where((values == 0) & (np.signbit(values) != np.signbit(wide_step)), -1.0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(wide_step != 0, (values - np.repeat(offset, HALF, axis=1)) / wide_step, signed_zero)
    return BlockCodes(kind, np.clip(np.rint(q), -128, 127).astype(np.int8), step, offset)


def fuse(parts: list[BlockCodes]) -> BlockCodes:
    """Row blocks of one weight (q, k and v; gate and up) as one: their common kind, or Q8_HALVES,
    which holds every other (4-bit codes fit 8 bits; no offset is offset -0.0)."""
    kinds = {p.kind for p in parts}
    kind = kinds.pop() if len(kinds) == 1 else Q8_HALVES
    return BlockCodes(kind, *(np.concatenate([getattr(p, f) for p in parts]) for f in ("codes", "step", "offset")))
