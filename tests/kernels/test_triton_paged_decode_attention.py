"""Paged decode attention (split-K, GQA) against the torch reference."""
from __future__ import annotations

import pytest
import torch
from kernel_test_inputs import assert_close, make_paged_kv, poisoned_like
from sliding_window_inputs import release_behind_window, windowed_reference

from kvserve.kernels.paged_decode_attention import (choose_num_splits, paged_decode_attention_torch,
                                                    paged_decode_attention_triton)

NUM_KV_HEADS = 2


def _run(device, dtype, group, head_size, block_size, seq_lens, num_splits=None, seed=0,
         table_dtype=torch.int32, strided_query=False):
    gen = torch.Generator().manual_seed(seed)
    kv = make_paged_kv(seq_lens, NUM_KV_HEADS, head_size, block_size, dtype, device, gen, table_dtype)
    num_heads = NUM_KV_HEADS * group
    if strided_query:  # a view into a fused qkv projection, as the model produces it
        qkv = torch.randn(len(seq_lens), num_heads + 2 * NUM_KV_HEADS, head_size, generator=gen)
        query = qkv.to(dtype).to(device)[:, :num_heads]
    else:
        query = torch.randn(len(seq_lens), num_heads, head_size, generator=gen).to(dtype).to(device)
    scale = head_size ** -0.5
    out = poisoned_like(query)
    result = paged_decode_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens,
                                           scale, max_seq_len=max(seq_lens), num_splits=num_splits, out=out)
    assert result is out
    expected = paged_decode_attention_torch(query.float(), kv.key_cache.float(), kv.value_cache.float(),
                                            kv.block_tables, kv.seq_lens, scale)
    assert_close(out, expected, dtype)


# GQA ratios 1/2/4/8, head sizes 64/80/96/128, ragged lengths, block sizes 16 and 8.
@pytest.mark.parametrize("dtype,group,head_size,block_size", [
    (torch.float32, 1, 64, 16),
    (torch.float32, 2, 80, 16),
    (torch.float16, 4, 96, 16),
    (torch.bfloat16, 8, 128, 16),
    (torch.float32, 4, 128, 8),
])
def test_single_split_matches_reference(device, dtype, group, head_size, block_size):
    _run(device, dtype, group, head_size, block_size, [1, 17, 50, 33], num_splits=1)


# Several splits merged by log-sum-exp; 3 is not a power of two, and with 8
# splits the 65-token request leaves most of its splits empty.
@pytest.mark.parametrize("dtype,group,head_size,num_splits,seq_lens", [
    (torch.float32, 4, 80, 3, [300, 1, 190]),
    (torch.float32, 2, 128, 8, [1, 65, 520]),
    (torch.float16, 8, 96, 4, [270, 129]),
    (torch.bfloat16, 1, 64, 2, [200, 77]),
])
def test_split_k_merge_matches_reference(device, dtype, group, head_size, num_splits, seq_lens):
    _run(device, dtype, group, head_size, 16, seq_lens, num_splits=num_splits, seed=1)


def test_auto_split_count_on_long_context(device):
    """The heuristic picks several splits for a long context and the result still matches."""
    seq_lens = [1100]
    assert choose_num_splits(1, NUM_KV_HEADS, max(seq_lens), 8) > 1
    _run(device, torch.float32, 4, 64, 16, seq_lens, num_splits=None, seed=2)


def test_strided_query_and_int64_block_table(device):
    _run(device, torch.float32, 2, 96, 16, [40, 3], num_splits=2, seed=3, table_dtype=torch.int64,
         strided_query=True)


def test_choose_num_splits():
    assert choose_num_splits(64, 8, 1024, 132) == 1          # the batch alone fills the GPU
    assert choose_num_splits(1, 8, 200, 132) == 1            # too short to be worth a merge
    long = choose_num_splits(1, 8, 32768, 132)
    assert long >= 16 and long & (long - 1) == 0             # many splits, a power of two
    assert choose_num_splits(1, 8, 2048, 132) <= long        # never more splits for less context
    assert choose_num_splits(1, 1, 10**7, 10**4) == 64       # capped


def test_block_table_too_narrow_is_refused(device):
    kv = make_paged_kv([40], NUM_KV_HEADS, 64, 16, torch.float32, device, torch.Generator().manual_seed(4))
    query = torch.randn(1, NUM_KV_HEADS, 64, device=device)
    with pytest.raises(ValueError, match="too few columns"):
        paged_decode_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables[:, :2], kv.seq_lens,
                                      0.125, max_seq_len=40)


def _run_window(device, dtype, group, head_size, block_size, seq_lens, window, num_splits=None, seed=5):
    """Each query sees its context's last `window` positions; the blocks before them point at a
    NaN null block, which the kernel must not read."""
    gen = torch.Generator().manual_seed(seed)
    kv = make_paged_kv(seq_lens, NUM_KV_HEADS, head_size, block_size, dtype, device, gen)
    query = torch.randn(len(seq_lens), NUM_KV_HEADS * group, head_size, generator=gen).to(dtype).to(device)
    scale = head_size ** -0.5
    query_lens = [1] * len(seq_lens)
    expected = windowed_reference(query, kv, query_lens, scale, window)
    # The inputs are ones where the window changes the result.
    assert not torch.allclose(expected, windowed_reference(query, kv, query_lens, scale, None), atol=1e-2)
    released, num_released = release_behind_window(kv, query_lens, window)
    assert num_released > 0
    out = poisoned_like(query)
    paged_decode_attention_triton(query, released.key_cache, released.value_cache, released.block_tables,
                                  released.seq_lens, scale, max_seq_len=max(seq_lens), num_splits=num_splits,
                                  out=out, window=window)
    assert_close(out, expected, dtype)


# Windows of 37 (not a multiple of the block size: every start mid-block), 64 (a block-aligned
# start for the 320-token context, mid-block for the others) and 1 (the query's own position);
# contexts shorter than, equal to and one past the window.
@pytest.mark.parametrize("dtype,group,head_size,block_size,window,num_splits", [
    (torch.float32, 2, 64, 16, 37, 1),
    (torch.float32, 4, 80, 8, 37, 3),
    (torch.float32, 1, 64, 16, 64, None),
    (torch.bfloat16, 2, 128, 16, 64, 2),
    (torch.float16, 2, 64, 16, 1, 1),
])
def test_sliding_window_matches_windowed_reference(device, dtype, group, head_size, block_size, window,
                                                   num_splits):
    _run_window(device, dtype, group, head_size, block_size, [300, 1, 320, window, window + 1, 150], window,
                num_splits=num_splits)


def test_sliding_window_splits_over_a_long_context(device):
    """A 2,000-token context: the splits share the window's positions, whether the launcher sizes
    their count or four split a 300-token window."""
    _run_window(device, torch.float32, 2, 64, 16, [2000], 100, num_splits=None)
    _run_window(device, torch.float32, 2, 64, 16, [2000], 300, num_splits=4, seed=6)


def test_window_covering_every_context_is_full_attention(device):
    gen = torch.Generator().manual_seed(7)
    seq_lens = [40, 3, 64]
    kv = make_paged_kv(seq_lens, NUM_KV_HEADS, 64, 16, torch.float32, device, gen)
    query = torch.randn(len(seq_lens), NUM_KV_HEADS * 2, 64, generator=gen).to(device)
    for window in (64, 1000, 0, None):
        got = paged_decode_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens,
                                            0.125, num_splits=1, window=window)
        assert_close(got, paged_decode_attention_torch(query, kv.key_cache, kv.value_cache, kv.block_tables,
                                                       kv.seq_lens, 0.125), torch.float32)
