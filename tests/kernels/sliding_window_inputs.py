"""Sliding-window cases for the attention kernel tests: a dense torch reference with the window's
mask, and caches whose blocks behind each request's window are released as a sliding KV cache
group releases them (backend/kv_cache/manager.py): their table entries point at the null block 0,
which here holds NaN, so a kernel that reads any of it, even only to mask it, returns NaN."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from kernel_test_inputs import PagedKV

from kvserve.kernels.paged_attention_ref import gather_context


def windowed_reference(query: torch.Tensor, kv: PagedKV, query_lens: list[int], scale: float,
                       window: int | None) -> torch.Tensor:
    """query [T, Hq, D], each request's rows its last positions: the row at position p attends to
    the positions k with p - window < k <= p (window None: k <= p), in float32."""
    out = torch.empty(query.shape, dtype=torch.float32)
    start = 0
    for b, (seq_len, q_len) in enumerate(zip(kv.seq_lens.tolist(), query_lens)):
        rows = slice(start, start + q_len)
        start += q_len
        if q_len == 0:
            continue
        k, v = (gather_context(cache.cpu(), kv.block_tables[b].cpu(), seq_len).float().transpose(0, 1)
                for cache in (kv.key_cache, kv.value_cache))
        group = query.shape[1] // k.shape[0]
        q_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
        k_pos = torch.arange(seq_len)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        o = F.scaled_dot_product_attention(query[rows].float().cpu().transpose(0, 1),
                                           k.repeat_interleave(group, 0), v.repeat_interleave(group, 0),
                                           attn_mask=mask, scale=scale)
        out[rows] = o.transpose(0, 1)
    return out


def release_behind_window(kv: PagedKV, query_lens: list[int], window: int) -> tuple[PagedKV, int]:
    """kv's caches behind a NaN null block 0 (every block id moves up by one), with each request's
    blocks before the first position its first query row sees pointing at block 0. Returns the
    new caches and how many table entries now point at it."""
    block_size = kv.key_cache.shape[1]
    null = torch.full_like(kv.key_cache[:1], float("nan"))
    tables = kv.block_tables + 1
    released = 0
    for b, (seq_len, q_len) in enumerate(zip(kv.seq_lens.tolist(), query_lens)):
        first_live = max(0, seq_len - q_len - window + 1) // block_size
        tables[b, :first_live] = 0
        released += first_live
    return PagedKV(torch.cat([null, kv.key_cache]), torch.cat([null, kv.value_cache]), tables,
                   kv.seq_lens), released
