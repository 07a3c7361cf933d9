"""Rotary position embedding applied in place to query and key.

`cos_sin_cache[max_position, rotary_dim]` holds cos in its first half and sin in
its second half. Neox style rotates the two halves of each head; the
interleaved (GPT-J) style rotates even/odd pairs.
"""
from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def rotary_embedding_torch(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                           cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """query [T, Hq, D], key [T, Hkv, D], positions [T]; rotates the first rotary_dim dims in place."""
    rotary_dim = cos_sin_cache.shape[1]
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    for x in (query, key):
        rot = x[..., :rotary_dim]
        rot.copy_(_rotate(rot.float(), cos, sin, is_neox).to(x.dtype))
