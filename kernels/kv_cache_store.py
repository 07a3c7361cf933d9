"""Store the keys and values of a flat batch into the paged KV cache.

Cache layout (per layer, keys and values in separate tensors)::

    key_cache[num_blocks, block_size, num_kv_heads, head_size]
    slot = block_id * block_size + offset_in_block

`slot_mapping[t]` is the slot of flat token t, or -1 for a token whose KV must
not be written (padding, or a position another request already owns).

Rows are converted to the cache's dtype as they are stored; into an fp8 cache
they are clamped to the format's range first (scale 1.0: kernels/kv_quant.py).
"""
from __future__ import annotations

import torch

from kvserve.kernels._triton_utils import check, check_launch, jit, next_pow2, tl
from kvserve.kernels.kv_quant import byte_rows, fp8_max, is_fp8, quantize


def store_kv_cache_torch(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Reference and CPU path: scatter rows of key/value [T, Hkv, D] into the caches."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    num_blocks, block_size = key_cache.shape[:2]
    for src, cache in ((key, key_cache), (value, value_cache)):
        flat = cache.view(num_blocks * block_size, *cache.shape[2:])
        byte_rows(flat).index_copy_(0, slots, byte_rows(quantize(src[valid], cache.dtype)))


# --------------------------------------------------------------------------- Triton


@jit
def _fp8_codes(x, MANT: tl.constexpr, BIAS: tl.constexpr):
    """float32 x, already clamped to the fp8 format's range -> its codes (int32 in 0..255): round to
    nearest even, subnormals included, the bits torch's conversion gives. Integer arithmetic on the
    float's bits rather than a cast, so it is the same on every GPU (no fp8 conversion instruction
    needed) and under the interpreter (whose fp8 casts lose the carry when rounding crosses a power
    of two)."""
    DROP: tl.constexpr = 23 - MANT                  # float32 mantissa bits the format drops
    MIN_NORMAL_EXP: tl.constexpr = 128 - BIAS       # float32 exponent field of the format's 2^(1 - BIAS)
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    exp = mag >> 23
    # Normal: drop DROP bits rounding to nearest even (a carry moves into the exponent), rebias.
    normal = ((mag + ((1 << (DROP - 1)) - 1) + ((mag >> DROP) & 1)) >> DROP) - ((127 - BIAS) << MANT)
    # Subnormal: the significand in units of the format's smallest subnormal, 2^(1 - BIAS - MANT).
    sig = (mag & 0x7FFFFF) | 0x800000
    d = tl.minimum(DROP + MIN_NORMAL_EXP - exp, 31)
    sub = (sig + ((1 << (d - 1)) - 1) + ((sig >> d) & 1)) >> d
    sub = tl.where(exp == 0, 0, sub)  # float32 zeros and denormals
    return tl.where(exp >= MIN_NORMAL_EXP, normal, sub) | sign


@jit
def _store_kv_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr, clamp_max,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kct, stride_kch,
    stride_vcb, stride_vct, stride_vch,
    NUM_HEADS: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, FP8_MANT: tl.constexpr, FP8_BIAS: tl.constexpr,
):
    """One program per token: copy its [num_kv_heads, head_size] K and V rows to their slot.
    FP8_MANT > 0: the caches are fp8 (their bytes, as uint8) with that many mantissa bits and
    exponent bias FP8_BIAS; rows are clamped into [-clamp_max, clamp_max] and rounded to codes."""
    t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    page = slot // BLOCK_SIZE
    row = slot % BLOCK_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h < NUM_HEADS)[:, None] & (offs_d < HEAD_SIZE)[None, :]
    t64 = t.to(tl.int64)

    k = tl.load(key_ptr + t64 * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(value_ptr + t64 * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    if FP8_MANT > 0:
        k = _fp8_codes(tl.minimum(tl.maximum(k.to(tl.float32), -clamp_max), clamp_max), FP8_MANT, FP8_BIAS)
        v = _fp8_codes(tl.minimum(tl.maximum(v.to(tl.float32), -clamp_max), clamp_max), FP8_MANT, FP8_BIAS)
    kc = key_cache_ptr + page * stride_kcb + row * stride_kct + offs_h[:, None] * stride_kch + offs_d[None, :]
    tl.store(kc, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    vc = value_cache_ptr + page * stride_vcb + row * stride_vct + offs_h[:, None] * stride_vch + offs_d[None, :]
    tl.store(vc, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


# fp8 cache dtype -> (mantissa bits, exponent bias) for the store kernel.
_FP8_LAYOUT = {torch.float8_e4m3fn: (3, 7), torch.float8_e5m2: (2, 15)}


def _launch_store_kv(key, value, key_cache, value_cache, slot_mapping) -> None:
    num_tokens, num_heads, head_size = key.shape
    check(value.shape == key.shape, "key and value must have the same shape [T, num_kv_heads, head_size]")
    check(key_cache.dim() == 4 and value_cache.shape == key_cache.shape,
          "KV caches must both be [num_blocks, block_size, num_kv_heads, head_size]")
    check(tuple(key_cache.shape[2:]) == (num_heads, head_size), "key rows do not match the cache's heads/head size")
    check(key.stride(-1) == 1 and value.stride(-1) == 1, "key and value need a contiguous head dim")
    check(key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1, "KV caches need a contiguous head dim")
    check(slot_mapping.shape == (num_tokens,) and slot_mapping.dtype in (torch.int32, torch.int64),
          "slot_mapping must be [T] int32/int64")
    check(value_cache.dtype == key_cache.dtype, "key and value caches must have one dtype")
    check_launch(_store_kv_kernel, key, value, key_cache, value_cache, slot_mapping)
    fp8 = is_fp8(key_cache.dtype)
    mant, bias = _FP8_LAYOUT[key_cache.dtype] if fp8 else (0, 0)
    _store_kv_kernel[(num_tokens,)](
        key, value, byte_rows(key_cache), byte_rows(value_cache), slot_mapping,
        fp8_max(key_cache.dtype) if fp8 else 0.0,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        NUM_HEADS=num_heads, HEAD_SIZE=head_size, BLOCK_SIZE=key_cache.shape[1],
        BLOCK_H=next_pow2(num_heads), BLOCK_D=next_pow2(head_size), FP8_MANT=mant, FP8_BIAS=bias,
        num_warps=4,
    )


def store_kv_cache_triton(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Triton version of `store_kv_cache_torch` (same contract; key/value may be strided views)."""
    check(key.dim() == 3, "key must be [T, num_kv_heads, head_size]")
    if key.shape[0] == 0:
        return
    _launch_store_kv(key, value, key_cache, value_cache, slot_mapping)
