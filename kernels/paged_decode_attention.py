"""Paged decode attention: one query token per request, split-K over the context.

Flash-decoding in two passes. Pass 1 runs one program per
(request, KV head, split): it loads the queries of every head that shares the
KV head (the GQA group, padded to 16 rows so tl.dot gets a legal tile) and
streams its share of the context, so each K/V tile is read once per group, not
once per query head. Pass 2 merges the splits of each (request, head) by their
log-sum-exp. With a single split pass 1 writes the output directly.

Each program walks its tokens in tiles of BLOCK_N positions; the page of each
position is looked up in the block table inside the kernel::

    position p of request b  ->  page  = block_tables[b, p // block_size]
                                 row   = p % block_size
    K[p, kvh, :] = key_cache[page, row, kvh, :]     (a tile spans several pages)

Splits are cut per request from its own length (a whole number of tiles each),
so a short request in a ragged batch finishes its splits early instead of
idling on masked tiles; splits past its end are empty (lse = -inf).

With a sliding window W a request's visible positions are its last W: the
splits cut those, and its first tile starts at its first visible position
(mid-block, usually), so nothing before the window is read at all, neither the
released blocks behind it (stale ids or the null block in the table) nor masked
positions:

    positions   0 ........ len-W ........................ len
                [ not read ][ split 0 ][ split 1 ] ...      (tiles of BLOCK_N from len-W)
"""
from __future__ import annotations

import torch

from kvserve.kernels._triton_utils import (LOG2_E, cdiv, check, check_launch, dot_options, jit, next_pow2,
                                           num_sms, tl)
from kvserve.kernels.paged_attention_common import attend_tile, check_paged_attention_args, check_paged_cache
from kvserve.kernels.paged_attention_ref import paged_decode_attention_torch

__all__ = ["paged_decode_attention_triton", "paged_decode_attention_torch", "choose_num_splits"]

_BLOCK_N = 64                 # context positions per tile
_MIN_TOKENS_PER_SPLIT = 256   # below this a split's merge costs more than its parallelism buys
_MAX_SPLITS = 64


@jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    scale_log2, num_splits, window,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_ob, stride_oh,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, SLIDING: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + b)
    first = 0
    if SLIDING:
        first = tl.maximum(seq_len - window, 0)
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len - first, BLOCK_N), num_splits)
    start = first + split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_SIZE
    gd_mask = g_mask[:, None] & d_mask[None, :]

    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=gd_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + b.to(tl.int64) * stride_bt

    for tok0 in range(start, end, BLOCK_N):
        # Bounded at `end`: the request's last tile may run past its length.
        acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, offs_g, tok0, end, 0, table_row, k_cache_ptr,
                                    v_cache_ptr, kvh, stride_kb, stride_kt, stride_kh, stride_vb,
                                    stride_vt, stride_vh, scale_log2, HEAD_SIZE, BLOCK_SIZE, BLOCK_D,
                                    BLOCK_N, False, True, False, PRECISION)

    # An empty split (past the end of a short request) leaves l_i = 0: write
    # zeros and lse = -inf so the merge gives it no weight.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if DIRECT:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=gd_mask)
    else:
        part = part_out_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_d[None, :]
        tl.store(part, o, mask=gd_mask)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=g_mask)


@jit
def _decode_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, num_splits,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    stride_ob, stride_oh,
    HEAD_SIZE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_SIZE

    lse = tl.load(part_lse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(lse > float("-inf"), tl.exp2(lse - m), 0.0)
    part = part_out_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :]
    o = tl.load(part, mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, sms: int) -> int:
    """Splits per (request, KV head): enough programs to fill the GPU about twice,
    at least _MIN_TOKENS_PER_SPLIT positions each, rounded down to a power of two
    (a bounded set of merge-kernel variants)."""
    by_len = max(1, max_seq_len // _MIN_TOKENS_PER_SPLIT)
    by_occupancy = max(1, cdiv(2 * sms, batch * num_kv_heads))
    n = min(by_len, by_occupancy, _MAX_SPLITS)
    return 1 << (n.bit_length() - 1)


def _launch_decode(query, key_cache, value_cache, block_tables, seq_lens, out, scale, num_splits, window):
    batch, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    check_paged_attention_args(query, key_cache, value_cache, block_tables, out, batch)
    check(seq_lens.shape == (batch,) and seq_lens.dtype in (torch.int32, torch.int64), "seq_lens must be [batch] int")
    interpreted = check_launch(_decode_split_kernel, query, key_cache, value_cache, block_tables, seq_lens, out)
    upcast, precision = dot_options(query.dtype, interpreted)

    group = num_heads // num_kv_heads
    block_d = next_pow2(head_size)
    direct = num_splits == 1
    if direct:
        part_out = part_lse = out  # unused placeholders
        p_strides, l_strides = (0, 0, 0), (0, 0)
    else:
        part_out = torch.empty(batch, num_heads, num_splits, head_size, dtype=torch.float32, device=query.device)
        part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=query.device)
        p_strides, l_strides = part_out.stride()[:3], part_lse.stride()[:2]
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        query, key_cache, value_cache, block_tables, seq_lens,
        out, part_out, part_lse,
        scale * LOG2_E, num_splits, window,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        *p_strides, *l_strides,
        GROUP=group, HEAD_SIZE=head_size, BLOCK_SIZE=block_size,
        BLOCK_G=max(16, next_pow2(group)), BLOCK_D=block_d, BLOCK_N=_BLOCK_N,
        DIRECT=direct, UPCAST=upcast, PRECISION=precision, SLIDING=window > 0,
        num_warps=4,
    )
    if not direct:
        _decode_merge_kernel[(batch, num_heads)](
            part_out, part_lse, out, num_splits,
            *p_strides, *l_strides,
            out.stride(0), out.stride(1),
            HEAD_SIZE=head_size, BLOCK_S=next_pow2(num_splits), BLOCK_D=block_d,
            num_warps=4,
        )


def paged_decode_attention_triton(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                  block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, *,
                                  max_seq_len: int | None = None, num_splits: int | None = None,
                                  out: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """query [B, Hq, D] -> out [B, Hq, D]; same contract as `paged_decode_attention_torch`.

    `max_seq_len` (from the batch metadata) avoids a device sync to size the
    split count; `num_splits` overrides the heuristic. `window` (None or 0: the
    whole context) limits each query to its context's last `window` positions.
    """
    check(query.dim() == 3, "query must be [batch, num_heads, head_size]")
    check_paged_cache(key_cache, value_cache)
    if out is None:
        out = torch.empty_like(query)
    if query.shape[0] == 0:
        return out
    window = window or 0
    check(window >= 0, "window must be None or >= 0")
    if num_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        visible = min(max_seq_len, window) if window else max_seq_len  # what the splits share
        num_splits = choose_num_splits(query.shape[0], key_cache.shape[2], visible, num_sms(query.device))
    check(num_splits >= 1, "num_splits must be >= 1")
    if max_seq_len is not None:  # a short table would make the kernel read past it
        check(block_tables.shape[1] * key_cache.shape[1] >= max_seq_len,
              f"block_tables has too few columns for max_seq_len={max_seq_len}")
    _launch_decode(query, key_cache, value_cache, block_tables, seq_lens, out, scale, num_splits, window)
    return out
