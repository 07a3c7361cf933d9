"""Rotary position embedding applied in place to query and key.

`cos_sin_cache[max_position, rotary_dim]` holds cos in its first half and sin in
its second half. Neox style rotates the two halves of each head; the
interleaved (GPT-J) style rotates even/odd pairs.
"""
from __future__ import annotations

import torch

from kvserve.kernels._triton_utils import check, check_launch, jit, next_pow2, tl


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def rotary_embedding_torch(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                           cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """query [T, Hq, D], key [T, Hkv, D], positions [T]; rotates the first rotary_dim dims in place."""
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    rotate_torch(query, key, cos[:, None, :], sin[:, None, :], is_neox)


def rotate_torch(query: torch.Tensor, key: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                 is_neox: bool = True) -> None:
    """The rotation of `rotary_embedding_torch` with the angles already looked up: cos/sin [T, 1, rotary_dim / 2]."""
    rotary_dim = 2 * cos.shape[-1]
    for x in (query, key) if key is not None else (query,):
        rot = x[..., :rotary_dim]
        rot.copy_(_rotate(rot.float(), cos, sin, is_neox).to(x.dtype))


# --------------------------------------------------------------------------- Triton


@jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HALF: tl.constexpr, IS_NEOX: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """One program per token: rotate the first 2*HALF dims of all its q and k heads.

    Pair i is (i, i + HALF) in neox style and (2i, 2i + 1) interleaved; both
    rotate by the angle whose cos/sin sit at cos_sin[pos, i] / [pos, HALF + i].
    """
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs_r, mask=r_mask, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs_r, mask=r_mask, other=0.0).to(tl.float32)
    if IS_NEOX:
        off1 = offs_r
        off2 = offs_r + HALF
    else:
        off1 = 2 * offs_r
        off2 = 2 * offs_r + 1

    offs_hq = tl.arange(0, BLOCK_HQ)
    mask_q = (offs_hq < NUM_Q_HEADS)[:, None] & r_mask[None, :]
    base_q = q_ptr + t * stride_qt + offs_hq[:, None] * stride_qh
    x1 = tl.load(base_q + off1[None, :], mask=mask_q, other=0.0).to(tl.float32)
    x2 = tl.load(base_q + off2[None, :], mask=mask_q, other=0.0).to(tl.float32)
    tl.store(base_q + off1[None, :], (x1 * cos[None, :] - x2 * sin[None, :]).to(q_ptr.dtype.element_ty), mask=mask_q)
    tl.store(base_q + off2[None, :], (x2 * cos[None, :] + x1 * sin[None, :]).to(q_ptr.dtype.element_ty), mask=mask_q)

    offs_hk = tl.arange(0, BLOCK_HK)
    mask_k = (offs_hk < NUM_K_HEADS)[:, None] & r_mask[None, :]
    base_k = k_ptr + t * stride_kt + offs_hk[:, None] * stride_kh
    y1 = tl.load(base_k + off1[None, :], mask=mask_k, other=0.0).to(tl.float32)
    y2 = tl.load(base_k + off2[None, :], mask=mask_k, other=0.0).to(tl.float32)
    tl.store(base_k + off1[None, :], (y1 * cos[None, :] - y2 * sin[None, :]).to(k_ptr.dtype.element_ty), mask=mask_k)
    tl.store(base_k + off2[None, :], (y2 * cos[None, :] + y1 * sin[None, :]).to(k_ptr.dtype.element_ty), mask=mask_k)


def _launch_rotary(positions, query, key, cos_sin_cache, is_neox) -> None:
    num_tokens, num_q_heads, head_size = query.shape
    check(key.dim() == 3 and key.shape[0] == num_tokens and key.shape[2] == head_size,
          "key must be [T, num_kv_heads, head_size] like query")
    check(positions.shape == (num_tokens,) and positions.dtype in (torch.int32, torch.int64),
          "positions must be [T] int32/int64")
    check(cos_sin_cache.dim() == 2 and cos_sin_cache.stride(1) == 1, "cos_sin_cache must be [max_pos, rotary_dim]")
    rotary_dim = cos_sin_cache.shape[1]
    check(rotary_dim % 2 == 0 and rotary_dim <= head_size, f"rotary_dim {rotary_dim} must be even and <= head size")
    check(query.stride(-1) == 1 and key.stride(-1) == 1, "query and key need a contiguous head dim")
    check_launch(_rotary_kernel, positions, query, key, cos_sin_cache)
    _rotary_kernel[(num_tokens,)](
        positions, query, key, cos_sin_cache,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos_sin_cache.stride(0),
        NUM_Q_HEADS=num_q_heads, NUM_K_HEADS=key.shape[1], HALF=rotary_dim // 2, IS_NEOX=bool(is_neox),
        BLOCK_HQ=next_pow2(num_q_heads), BLOCK_HK=next_pow2(key.shape[1]), BLOCK_R=next_pow2(rotary_dim // 2),
        num_warps=4,
    )


def rotary_embedding_triton(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                            cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """Triton version of `rotary_embedding_torch`: rotates query and key in place."""
    check(query.dim() == 3, "query must be [T, num_heads, head_size]")
    if query.shape[0] == 0:
        return
    _launch_rotary(positions, query, key, cos_sin_cache, is_neox)
