"""Store the keys and values of a flat batch into the paged KV cache.

Cache layout (per layer, keys and values in separate tensors)::

    key_cache[num_blocks, block_size, num_kv_heads, head_size]
    slot = block_id * block_size + offset_in_block

`slot_mapping[t]` is the slot of flat token t, or -1 for a token whose KV must
not be written (padding, or a position another request already owns).
"""
from __future__ import annotations

import torch

from kvserve.kernels._triton_utils import check, check_launch, jit, next_pow2, tl


def store_kv_cache_torch(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Reference and CPU path: scatter rows of key/value [T, Hkv, D] into the caches."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    num_blocks, block_size = key_cache.shape[:2]
    flat_k = key_cache.view(num_blocks * block_size, *key_cache.shape[2:])
    flat_v = value_cache.view(num_blocks * block_size, *value_cache.shape[2:])
    flat_k.index_copy_(0, slots, key[valid].to(key_cache.dtype))
    flat_v.index_copy_(0, slots, value[valid].to(value_cache.dtype))


# --------------------------------------------------------------------------- Triton


@jit
def _store_kv_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kct, stride_kch,
    stride_vcb, stride_vct, stride_vch,
    NUM_HEADS: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per token: copy its [num_kv_heads, head_size] K and V rows to their slot."""
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
    kc = key_cache_ptr + page * stride_kcb + row * stride_kct + offs_h[:, None] * stride_kch + offs_d[None, :]
    tl.store(kc, k.to(key_cache_ptr.dtype.element_ty), mask=mask)

    v = tl.load(value_ptr + t64 * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    vc = value_cache_ptr + page * stride_vcb + row * stride_vct + offs_h[:, None] * stride_vch + offs_d[None, :]
    tl.store(vc, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


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
    check_launch(_store_kv_kernel, key, value, key_cache, value_cache, slot_mapping)
    _store_kv_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        NUM_HEADS=num_heads, HEAD_SIZE=head_size, BLOCK_SIZE=key_cache.shape[1],
        BLOCK_H=next_pow2(num_heads), BLOCK_D=next_pow2(head_size),
        num_warps=4,
    )


def store_kv_cache_triton(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Triton version of `store_kv_cache_torch` (same contract; key/value may be strided views)."""
    check(key.dim() == 3, "key must be [T, num_kv_heads, head_size]")
    if key.shape[0] == 0:
        return
    _launch_store_kv(key, value, key_cache, value_cache, slot_mapping)
