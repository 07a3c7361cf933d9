"""Store the keys and values of a flat batch into the paged KV cache.

Cache layout (per layer, keys and values in separate tensors)::

    key_cache[num_blocks, block_size, num_kv_heads, head_size]
    slot = block_id * block_size + offset_in_block

`slot_mapping[t]` is the slot of flat token t, or -1 for a token whose KV must
not be written (padding, or a position another request already owns).
"""
from __future__ import annotations

import torch


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
