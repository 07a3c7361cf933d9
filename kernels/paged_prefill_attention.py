"""Prefill / extend attention over the paged KV cache (variable-length batch).

Request b owns the flat query rows `query_start_loc[b]:query_start_loc[b+1]`
(no padding); they are the last q_len positions of its seq_len-token context,
whose earlier part (a cached prefix, earlier chunks) already sits in its
blocks, and the new tokens' own K/V have been stored there too. Query row i of
the request sits at absolute position ctx + i, ctx = seq_len - q_len, and sees
positions <= ctx + i.

One program per (query tile of BLOCK_M rows, request, query head); programs
whose tile starts past the request's q_len exit at once, so the grid is sized
by the longest chunk without padding the batch. Key tiles wholly before the
tile's first query row need no causal mask; only the last few (the diagonal)
are masked:

    keys  0 ........ ctx+m0 ....... ctx+m0+BLOCK_M
          [ unmasked tiles ][ diagonal tiles ]  (nothing past the tile's last row)

With a sliding window W, row i sees positions q - W < k <= q (q = ctx + i). Key
tiles start at the tile's first row's first visible position, lo = ctx+m0-W+1:
nothing before it is read (the released blocks behind the window, stale ids or
the null block in the table, sit there), and the tiles before the one that
starts at or past the last row's first visible position need the window's mask:

    keys  lo .... last row's first .............. ctx+m0 ....... ctx+m0+BLOCK_M
          [ window tiles ][ unmasked tiles       ][ diagonal tiles (causal and window) ]
"""
from __future__ import annotations

import torch

from kvserve.kernels._triton_utils import LOG2_E, cdiv, check, check_launch, dot_options, jit, next_pow2, tl
from kvserve.kernels.paged_attention_common import attend_tile, check_paged_attention_args
from kvserve.kernels.paged_attention_ref import paged_prefill_attention_torch

__all__ = ["paged_prefill_attention_triton", "paged_prefill_attention_torch"]

_BLOCK_N = 64


@jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    scale_log2, window,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, SLIDING: tl.constexpr,
):
    m_blk = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
    m0 = m_blk * BLOCK_M
    if m0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx = seq_len - q_len
    kvh = h // GROUP

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    md_mask = (offs_m < q_len)[:, None] & (offs_d < HEAD_SIZE)[None, :]
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=md_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    # Padding rows (offs_m >= q_len) sit past seq_len: they see every key and
    # are never stored, so no row of the tile is ever fully masked.
    q_pos = ctx + offs_m

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + b.to(tl.int64) * stride_bt

    hi = tl.minimum(seq_len, ctx + m0 + BLOCK_M)
    lo = 0
    unmasked = 0  # where the tiles every row sees in full begin
    if SLIDING:
        # Every row sees a key of the first tile (so its running max is finite from there on):
        # row r's first visible position is at most lo + r.
        tl.static_assert(BLOCK_M <= BLOCK_N)
        # Padding rows would see nothing of a short window: they take the last real row's keys.
        q_pos = ctx + tl.minimum(offs_m, q_len - 1)
        lo = tl.maximum(ctx + m0 - window + 1, 0)
        unmasked = lo + tl.cdiv(tl.maximum(hi - window - lo, 0), BLOCK_N) * BLOCK_N
    full_end = lo + (ctx + m0 - lo) // BLOCK_N * BLOCK_N
    if SLIDING:
        for tok0 in range(lo, tl.minimum(unmasked, full_end), BLOCK_N):
            acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, q_pos, tok0, seq_len, window, table_row, k_cache_ptr,
                                        v_cache_ptr, kvh, stride_kb, stride_kt, stride_kh, stride_vb,
                                        stride_vt, stride_vh, scale_log2, HEAD_SIZE, BLOCK_SIZE, BLOCK_D,
                                        BLOCK_N, False, True, True, PRECISION)
    for tok0 in range(unmasked, full_end, BLOCK_N):
        acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, q_pos, tok0, seq_len, 0, table_row, k_cache_ptr,
                                    v_cache_ptr, kvh, stride_kb, stride_kt, stride_kh, stride_vb,
                                    stride_vt, stride_vh, scale_log2, HEAD_SIZE, BLOCK_SIZE, BLOCK_D,
                                    BLOCK_N, False, False, False, PRECISION)
    for tok0 in range(full_end, hi, BLOCK_N):
        if SLIDING:
            acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, q_pos, tok0, seq_len, window, table_row, k_cache_ptr,
                                        v_cache_ptr, kvh, stride_kb, stride_kt, stride_kh, stride_vb,
                                        stride_vt, stride_vh, scale_log2, HEAD_SIZE, BLOCK_SIZE, BLOCK_D,
                                        BLOCK_N, True, True, True, PRECISION)
        else:
            acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, q_pos, tok0, seq_len, 0, table_row, k_cache_ptr,
                                        v_cache_ptr, kvh, stride_kb, stride_kt, stride_kh, stride_vb,
                                        stride_vt, stride_vh, scale_log2, HEAD_SIZE, BLOCK_SIZE, BLOCK_D,
                                        BLOCK_N, True, True, False, PRECISION)

    o = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=md_mask)


def _launch_prefill(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, out, scale,
                    max_query_len, window):
    num_tokens, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    batch = seq_lens.shape[0]
    check_paged_attention_args(query, key_cache, value_cache, block_tables, out, batch)
    check(seq_lens.dtype in (torch.int32, torch.int64), "seq_lens must be int32 or int64")
    check(query_start_loc.shape == (batch + 1,) and query_start_loc.dtype in (torch.int32, torch.int64),
          "query_start_loc must be [batch + 1] int")
    interpreted = check_launch(_prefill_kernel, query, key_cache, value_cache, block_tables, seq_lens,
                               query_start_loc, out)
    upcast, precision = dot_options(query.dtype, interpreted)

    # Short chunks (decodes mixed into the batch) get short tiles.
    block_m = min(64, max(16, next_pow2(max_query_len)))
    grid = (cdiv(max_query_len, block_m), batch, num_heads)
    _prefill_kernel[grid](
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, out,
        scale * LOG2_E, window,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_SIZE=head_size, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_D=next_pow2(head_size), BLOCK_N=_BLOCK_N,
        UPCAST=upcast, PRECISION=precision, SLIDING=window > 0,
        num_warps=4 if head_size <= 64 else 8,
    )


def paged_prefill_attention_triton(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                   block_tables: torch.Tensor, seq_lens: torch.Tensor,
                                   query_start_loc: torch.Tensor, scale: float, *,
                                   max_query_len: int | None = None, max_seq_len: int | None = None,
                                   out: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """query [T, Hq, D] -> out [T, Hq, D]; same contract as `paged_prefill_attention_torch`.

    `max_query_len` (from the batch metadata) sizes the grid without a device
    sync; `max_seq_len`, when given, lets the launcher check the block table is
    wide enough. `window` (None or 0: the whole context) limits each query row
    to its last `window` positions.
    """
    check(query.dim() == 3, "query must be [num_tokens, num_heads, head_size]")
    window = window or 0
    check(window >= 0, "window must be None or >= 0")
    if out is None:
        out = torch.empty_like(query)
    if query.shape[0] == 0 or seq_lens.shape[0] == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_query_len == 0:
        return out
    if max_seq_len is not None:  # a short table would make the kernel read past it
        check(block_tables.shape[1] * key_cache.shape[1] >= max_seq_len,
              f"block_tables has too few columns for max_seq_len={max_seq_len}")
    _launch_prefill(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, out, scale,
                    max_query_len, window)
    return out
