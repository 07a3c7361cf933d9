"""What the decode and prefill paged attention kernels share: their launchers'
argument checks, and the inner step, one key/value tile of the paged cache
folded into a running online softmax.

The query tile `q` [rows, BLOCK_D] attends to positions tok0 .. tok0+BLOCK_N-1
of one request, whose pages come from `table_row`. The running state is the
flash-attention triple in base 2 (scores are pre-scaled by log2(e)/sqrt(d)):
`m_i` the row maxima, `l_i` the row sums of exp2(s - m_i), `acc` the weighted
values. Which keys a row may see is the caller's to say, at compile time:

    CAUSAL        row r sees positions <= q_pos[r] (and < bound)   prefill diagonal tiles
    BOUNDED       every row sees positions < bound                 decode, ragged ends
    neither       every key of the tile is visible                 prefill tiles before the diagonal

The caches may hold another dtype than the query (bfloat16, or fp8 with a scale of 1.0:
kernels/kv_quant.py): each K and V tile is converted to the query's dtype as it is loaded, so an
fp8 cache is dequantized in the inner loop and its tiles cost a quarter of float32's bytes.
"""
from __future__ import annotations

import torch

from kvserve.kernels._triton_utils import check, jit, tl


def check_paged_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    check(key_cache.dim() == 4, "key_cache must be [num_blocks, block_size, num_kv_heads, head_size]")
    check(value_cache.shape == key_cache.shape, "value_cache must have key_cache's shape")
    check(key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1, "KV caches need a contiguous head dim")


def check_paged_attention_args(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                               block_tables: torch.Tensor, out: torch.Tensor, batch: int) -> None:
    """query and out [rows, Hq, D]; caches [num_blocks, block_size, Hkv, D]; block_tables [batch, max_blocks]."""
    check_paged_cache(key_cache, value_cache)
    _, num_heads, head_size = query.shape
    num_kv_heads = key_cache.shape[2]
    check(key_cache.shape[3] == head_size, "query and KV cache head sizes differ")
    check(num_heads % num_kv_heads == 0, f"{num_heads} query heads not a multiple of {num_kv_heads} KV heads")
    check(16 <= head_size <= 256, f"head size {head_size} outside 16..256")
    check(query.stride(-1) == 1 and out.stride(-1) == 1, "query and out need a contiguous head dim")
    check(out.shape == query.shape and out.dtype == query.dtype, "out must match query's shape and dtype")
    check(block_tables.dim() == 2 and block_tables.shape[0] == batch and block_tables.stride(1) == 1,
          "block_tables must be [batch, max_blocks] with contiguous rows")
    check(block_tables.dtype in (torch.int32, torch.int64), "block_tables must be int32 or int64")


@jit
def attend_tile(acc, m_i, l_i, q, q_pos, tok0, bound, window, table_row, k_cache_ptr, v_cache_ptr, kvh,
                stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, scale_log2,
                HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, BOUNDED: tl.constexpr, WINDOWED: tl.constexpr,
                PRECISION: tl.constexpr):
    """Online-softmax update of one (query tile, key tile) pair; returns (acc, m_i, l_i). WINDOWED:
    row r sees only positions > q_pos[r] - window (and < bound, and, if CAUSAL, <= q_pos[r]); keys
    a row cannot see are loaded for the other rows, so the caller starts at positions some row
    sees, which lie in live blocks."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    toks = tok0 + offs_n
    n_mask = toks < bound
    nd_mask = n_mask[:, None] & (offs_d < HEAD_SIZE)[None, :]
    page = tl.load(table_row + toks // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    row = toks % BLOCK_SIZE

    k_off = page * stride_kb + row * stride_kt + kvh * stride_kh
    k = tl.load(k_cache_ptr + k_off[:, None] + offs_d[None, :], mask=nd_mask, other=0.0).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    if WINDOWED:
        visible = (toks[None, :] > q_pos[:, None] - window) & n_mask[None, :]
        if CAUSAL:
            visible &= toks[None, :] <= q_pos[:, None]
        s = tl.where(visible, s, float("-inf"))
    elif CAUSAL:
        s = tl.where((toks[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
    elif BOUNDED:
        s = tl.where(n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)

    v_off = page * stride_vb + row * stride_vt + kvh * stride_vh
    v = tl.load(v_cache_ptr + v_off[:, None] + offs_d[None, :], mask=nd_mask, other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i
