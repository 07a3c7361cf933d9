"""Torch references (and the CPU path) for attention over the paged KV cache.

Both functions take the batch flattened without padding: request i owns the
query rows `query_start_loc[i]:query_start_loc[i+1]`, which are the *last*
q_len positions of its context of `seq_lens[i]` tokens (a cached prefix or
earlier prefill chunks already sit in its blocks). Attention is causal.

On the CPU the cost is moving K/V, not arithmetic, so two choices matter:
contexts are gathered with one `index_select` over flat slots (several times
faster than advanced indexing of whole blocks), and the G query heads that
share a KV head are folded into G query rows of that head, so no K/V copy is
repeated per query head (as `enable_gqa` would do).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _slots(block_table_rows: torch.Tensor, num_blocks: int, block_size: int) -> torch.Tensor:
    """Flat slot ids of the first num_blocks blocks of each row: [rows * num_blocks * block_size]."""
    blocks = block_table_rows[..., :num_blocks].long()
    return (blocks[..., None] * block_size + torch.arange(block_size, device=blocks.device)).reshape(-1)


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first seq_len rows [S, Hkv, D] of one request's paged K or V."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    flat = cache.reshape(-1, *cache.shape[2:])
    return flat.index_select(0, _slots(block_table, num_blocks, block_size)[:seq_len])


def paged_decode_attention_torch(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                 block_tables: torch.Tensor, seq_lens: torch.Tensor,
                                 scale: float) -> torch.Tensor:
    """One query token per request: query [B, Hq, D] -> out [B, Hq, D], batched in one call."""
    batch, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    block_size = key_cache.shape[1]
    num_blocks = (int(seq_lens.max()) + block_size - 1) // block_size
    span = num_blocks * block_size
    slots = _slots(block_tables, num_blocks, block_size)
    k, v = (cache.reshape(-1, num_kv_heads, head_dim).index_select(0, slots)
            .view(batch, span, num_kv_heads, head_dim).transpose(1, 2).to(query.dtype)
            for cache in (key_cache, value_cache))
    positions = torch.arange(span, device=query.device)
    mask = (positions[None, :] < seq_lens[:, None].to(query.device))[:, None, None, :]
    o = F.scaled_dot_product_attention(query.view(batch, num_kv_heads, group, head_dim), k, v,
                                       attn_mask=mask, scale=scale)
    return o.reshape(batch, num_heads, head_dim)


def _one_request(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_len: int, scale: float) -> torch.Tensor:
    """Causal attention of q [L, Hq, D] (the last L positions) over one request's context."""
    q_len, num_heads, head_dim = q.shape
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    k = gather_context(key_cache, block_table, seq_len).to(q.dtype).transpose(0, 1)
    v = gather_context(value_cache, block_table, seq_len).to(q.dtype).transpose(0, 1)
    # Rows ordered (group member, position): row g * L + l is query head kv * G + g at position l.
    rows = q.view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(
        num_kv_heads, group * q_len, head_dim)
    q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
    k_pos = torch.arange(seq_len, device=q.device)
    mask = (k_pos[None, :] <= q_pos[:, None]).repeat(group, 1)
    o = F.scaled_dot_product_attention(rows, k, v, attn_mask=mask, scale=scale)
    return o.view(num_kv_heads, group, q_len, head_dim).permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim)


def paged_prefill_attention_torch(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                  block_tables: torch.Tensor, seq_lens: torch.Tensor,
                                  query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """query [T, Hq, D] -> out [T, Hq, D]; any mix of prefill chunks and decodes.

    Requests with one query row (decodes) go through the batched decode path
    together; prefill chunks are computed one request at a time.
    """
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    decodes = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
    if decodes:
        rows = torch.tensor([starts[i] for i in decodes], device=query.device)
        idx = torch.tensor(decodes, device=query.device)
        out[rows] = paged_decode_attention_torch(query[rows], key_cache, value_cache, block_tables[idx],
                                                 seq_lens[idx], scale)
    for i, seq_len in enumerate(lens):
        q_start, q_end = starts[i], starts[i + 1]
        if q_end - q_start > 1:
            out[q_start:q_end] = _one_request(query[q_start:q_end], key_cache, value_cache, block_tables[i],
                                              seq_len, scale)
    return out
