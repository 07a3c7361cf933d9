"""Prefill / extend attention over the paged cache against the torch reference."""
from __future__ import annotations

import pytest
import torch
from kernel_test_inputs import assert_close, make_paged_kv, poisoned_like
from sliding_window_inputs import release_behind_window, windowed_reference

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


def _run_window(device, dtype, group, head_size, block_size, seq_lens, query_lens, window, seed=3):
    """Each query row sees its last `window` positions; the blocks before the first row's window
    point at a NaN null block, which the kernel must not read."""
    gen = torch.Generator().manual_seed(seed)
    kv = make_paged_kv(seq_lens, NUM_KV_HEADS, head_size, block_size, dtype, device, gen)
    starts = torch.tensor([0] + query_lens).cumsum(0).to(torch.int32).to(device)
    query = torch.randn(sum(query_lens), NUM_KV_HEADS * group, head_size, generator=gen).to(dtype).to(device)
    scale = head_size ** -0.5
    expected = windowed_reference(query, kv, query_lens, scale, window)
    # The inputs are ones where the window changes the result.
    assert not torch.allclose(expected, windowed_reference(query, kv, query_lens, scale, None), atol=1e-2)
    released, num_released = release_behind_window(kv, query_lens, window)
    assert num_released > 0
    out = poisoned_like(query)
    paged_prefill_attention_triton(query, released.key_cache, released.value_cache, released.block_tables,
                                   released.seq_lens, starts, scale, max_query_len=max(query_lens), out=out,
                                   window=window)
    assert_close(out, expected, dtype)


# The mixed batch under windows of 5 and 37 (not multiples of the block size: the first rows'
# windows start mid-block) and 32 (a multiple); shorter windows than the query tile, so the
# diagonal tiles are window-masked too.
@pytest.mark.parametrize("dtype,group,head_size,block_size,window", [
    (torch.float32, 1, 64, 16, 37),
    (torch.float32, 2, 80, 8, 5),
    (torch.float16, 4, 96, 16, 32),
    (torch.bfloat16, 2, 128, 8, 37),
])
def test_sliding_window_mixed_batch(device, dtype, group, head_size, block_size, window):
    _run_window(device, dtype, group, head_size, block_size, *MIXED, window)


def test_sliding_window_long_chunk_takes_every_kind_of_tile(device):
    """A 200-row chunk over a 200-token prefix with a window of 150: each query tile reads a
    window-masked tile, an unmasked one and diagonal ones from its first row's window start on."""
    _run_window(device, torch.float32, 2, 64, 16, [400, 90], [200, 90], 150, seed=4)


def test_window_covering_every_context_is_full_attention(device):
    gen = torch.Generator().manual_seed(5)
    seq_lens, query_lens = [100, 7, 40], [70, 7, 1]
    kv = make_paged_kv(seq_lens, NUM_KV_HEADS, 64, 16, torch.float32, device, gen)
    starts = torch.tensor([0] + query_lens).cumsum(0).to(torch.int32).to(device)
    query = torch.randn(sum(query_lens), NUM_KV_HEADS, 64, generator=gen).to(device)
    expected = paged_prefill_attention_torch(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens,
                                             starts, 0.125)
    for window in (100, 0, None):
        got = paged_prefill_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens,
                                             starts, 0.125, window=window)
        assert_close(got, expected, torch.float32)
