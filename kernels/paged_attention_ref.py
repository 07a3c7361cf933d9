"""Torch references (and the CPU path) for attention over the paged KV cache.

Both functions take the batch flattened without padding: request i owns the
query rows `query_start_loc[i]:query_start_loc[i+1]`, which are the *last*
q_len positions of its context of `seq_lens[i]` tokens (a cached prefix or
earlier prefill chunks already sit in its blocks). Attention is causal.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first seq_len rows [S, Hkv, D] of one request's paged K or V."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]
    return blocks.reshape(num_blocks * block_size, *cache.shape[2:])[:seq_len]


def paged_prefill_attention_torch(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                  block_tables: torch.Tensor, seq_lens: torch.Tensor,
                                  query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """query [T, Hq, D] -> out [T, Hq, D]; any mix of prefill chunks and decodes."""
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        k = gather_context(key_cache, block_tables[i], seq_len).to(query.dtype)
        v = gather_context(value_cache, block_tables[i], seq_len).to(query.dtype)
        q = query[q_start:q_end].transpose(0, 1)
        if q_len == 1:
            mask = None
        else:
            q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
            k_pos = torch.arange(seq_len, device=query.device)
            mask = k_pos[None, :] <= q_pos[:, None]
        o = F.scaled_dot_product_attention(q, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                           scale=scale, enable_gqa=True)
        out[q_start:q_end] = o.transpose(0, 1)
    return out


def paged_decode_attention_torch(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                 block_tables: torch.Tensor, seq_lens: torch.Tensor,
                                 scale: float) -> torch.Tensor:
    """One query token per request: query [B, Hq, D] -> out [B, Hq, D], batched in one call."""
    batch = query.shape[0]
    max_len = int(seq_lens.max())
    block_size = key_cache.shape[1]
    num_blocks = (max_len + block_size - 1) // block_size
    table = block_tables[:, :num_blocks].long()
    k = key_cache[table].reshape(batch, num_blocks * block_size, *key_cache.shape[2:]).to(query.dtype)
    v = value_cache[table].reshape(batch, num_blocks * block_size, *value_cache.shape[2:]).to(query.dtype)
    positions = torch.arange(num_blocks * block_size, device=query.device)
    mask = (positions[None, :] < seq_lens[:, None].to(query.device))[:, None, None, :]
    o = F.scaled_dot_product_attention(query[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, scale=scale, enable_gqa=True)
    return o[:, :, 0, :]
