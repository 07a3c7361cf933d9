"""Prefill / extend attention over the paged cache against the torch reference."""
from __future__ import annotations

import pytest
import torch
from kernel_test_inputs import assert_close, make_paged_kv, poisoned_like

from kvserve.kernels.paged_prefill_attention import paged_prefill_attention_torch, paged_prefill_attention_triton

NUM_KV_HEADS = 2


def _run(device, dtype, group, head_size, block_size, seq_lens, query_lens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kv = make_paged_kv(seq_lens, NUM_KV_HEADS, head_size, block_size, dtype, device, gen)
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    query_start_loc = torch.tensor(starts, dtype=torch.int32, device=device)
    query = torch.randn(starts[-1], NUM_KV_HEADS * group, head_size, generator=gen).to(dtype).to(device)
    scale = head_size ** -0.5
    out = poisoned_like(query)
    result = paged_prefill_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens,
                                            query_start_loc, scale, max_query_len=max(query_lens), out=out)
    assert result is out
    expected = paged_prefill_attention_torch(query.float(), kv.key_cache.float(), kv.value_cache.float(),
                                             kv.block_tables, kv.seq_lens, query_start_loc, scale)
    assert_close(out, expected, dtype)


# One mixed batch per case: a chunk over a cached prefix, a fresh prompt with
# no prefix, a decode, a one-token prompt, a request with no tokens this step.
MIXED = ([100, 7, 130, 1, 40], [70, 7, 1, 1, 0])


@pytest.mark.parametrize("dtype,group,head_size,block_size", [
    (torch.float32, 1, 64, 16),
    (torch.float32, 2, 80, 16),
    (torch.float16, 4, 96, 16),
    (torch.bfloat16, 8, 128, 8),
])
def test_mixed_batch_matches_reference(device, dtype, group, head_size, block_size):
    _run(device, dtype, group, head_size, block_size, *MIXED)


def test_long_chunk_over_long_prefix(device):
    """Several query tiles; key tiles before the diagonal take the unmasked path. A
    prefix of 65 puts the last key of a full 64-row query tile at a key-tile start."""
    _run(device, torch.float32, 4, 64, 16, [155, 150], [90, 150], seed=1)


def test_decode_only_batch_through_prefill_kernel(device):
    _run(device, torch.float16, 2, 128, 16, [5, 64, 33], [1, 1, 1], seed=2)
