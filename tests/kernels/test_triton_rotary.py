"""Rotary embedding (neox and interleaved, full and partial) against the torch reference."""
from __future__ import annotations

import pytest
import torch
from kernel_test_inputs import assert_close

from kvserve.kernels.rotary import rotary_embedding_torch, rotary_embedding_triton


def _cos_sin_cache(max_pos: int, rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    angles = torch.arange(max_pos).float()[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype,num_heads,num_kv_heads,head_size,rotary_dim", [
    (torch.float32, 4, 4, 64, 64),
    (torch.float16, 8, 2, 80, 80),
    (torch.bfloat16, 4, 1, 128, 64),   # partial rotary: dims past 64 stay as they were
    (torch.float32, 6, 3, 96, 32),
])
def test_rotary_matches_reference(device, is_neox, dtype, num_heads, num_kv_heads, head_size, rotary_dim):
    gen = torch.Generator().manual_seed(0)
    tokens = 9
    cache = _cos_sin_cache(4096, rotary_dim).to(device)
    positions = torch.randint(0, 4096, (tokens,), generator=gen).to(device)
    # query/key as views into a fused qkv projection
    qkv = torch.randn(tokens, num_heads + 2 * num_kv_heads, head_size, generator=gen).to(dtype).to(device)
    query, key = qkv[:, :num_heads], qkv[:, num_heads:num_heads + num_kv_heads]
    ref_q, ref_k = query.clone(), key.clone()
    before = qkv.clone()

    rotary_embedding_triton(positions, query, key, cache, is_neox)
    rotary_embedding_torch(positions, ref_q, ref_k, cache, is_neox)

    assert_close(query, ref_q, dtype)
    assert_close(key, ref_k, dtype)
    assert torch.equal(qkv[..., rotary_dim:], before[..., rotary_dim:])          # untouched tail
    assert torch.equal(qkv[:, num_heads + num_kv_heads:], before[:, num_heads + num_kv_heads:])  # value
    assert not torch.equal(query[..., :rotary_dim], before[:, :num_heads, :rotary_dim])
