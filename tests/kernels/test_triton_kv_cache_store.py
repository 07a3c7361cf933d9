"""KV-cache store against the torch reference: every slot, written or not, must match."""
from __future__ import annotations

import pytest
import torch

from kvserve.kernels.kv_cache_store import store_kv_cache_torch, store_kv_cache_triton


@pytest.mark.parametrize("src_dtype,cache_dtype,num_kv_heads,head_size,block_size,slot_dtype", [
    (torch.float32, torch.float32, 2, 80, 16, torch.int64),
    (torch.float16, torch.float16, 8, 128, 16, torch.int32),
    (torch.bfloat16, torch.bfloat16, 1, 96, 8, torch.int64),
    (torch.float32, torch.bfloat16, 4, 64, 5, torch.int32),
])
def test_store_matches_reference(device, src_dtype, cache_dtype, num_kv_heads, head_size, block_size, slot_dtype):
    gen = torch.Generator().manual_seed(0)
    num_tokens, num_blocks = 23, 9
    # key and value as views into a fused qkv projection (non-contiguous rows)
    qkv = torch.randn(num_tokens, 3 * num_kv_heads, head_size, generator=gen).to(src_dtype).to(device)
    key, value = qkv[:, num_kv_heads:2 * num_kv_heads], qkv[:, 2 * num_kv_heads:]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.tensor([0, 7, 8, 22])] = -1
    slots = slots.to(slot_dtype).to(device)
    # poisoned caches: a skipped or misplaced write shows up as a NaN mismatch
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_size), float("nan"), dtype=cache_dtype,
                           device=device)
    value_cache = torch.full_like(key_cache, float("nan"))
    ref_k, ref_v = key_cache.clone(), value_cache.clone()

    store_kv_cache_triton(key, value, key_cache, value_cache, slots)
    store_kv_cache_torch(key, value, ref_k, ref_v, slots)

    # same dtype: bit exact; float32 -> bf16 allows the interpreter's truncating cast
    tol = {} if src_dtype == cache_dtype else dict(atol=1e-2, rtol=1e-2)
    for got, ref in ((key_cache, ref_k), (value_cache, ref_v)):
        assert torch.equal(got.isnan(), ref.isnan())
        torch.testing.assert_close(got.nan_to_num(0.0), ref.nan_to_num(0.0), **({"atol": 0, "rtol": 0} | tol))


def test_all_slots_skipped_leaves_cache_untouched(device):
    key = torch.randn(4, 2, 64, device=device)
    cache = torch.full((2, 4, 2, 64), float("nan"), device=device)
    vcache = cache.clone()
    store_kv_cache_triton(key, key, cache, vcache, torch.full((4,), -1, dtype=torch.int32, device=device))
    assert cache.isnan().all() and vcache.isnan().all()
