"""The Triton kernels over fp8 caches: the store quantizes as the torch reference does (clamped,
round to nearest even), and decode and prefill attention, which convert each loaded K/V tile to the
query's dtype, match the reference run on the dequantized caches. Small shapes: under the
interpreter these run in numpy."""
from __future__ import annotations

import pytest
import torch
from kernel_test_inputs import assert_close, make_paged_kv, poisoned_like

from kvserve.kernels.kv_cache_store import store_kv_cache_torch, store_kv_cache_triton
from kvserve.kernels.kv_quant import fp8_values, quantize
from kvserve.kernels.paged_decode_attention import paged_decode_attention_torch, paged_decode_attention_triton
from kvserve.kernels.paged_prefill_attention import paged_prefill_attention_torch, paged_prefill_attention_triton

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _fp8_kv(seq_lens, head_size, block_size, dtype, device, gen):
    kv = make_paged_kv(seq_lens, 2, head_size, block_size, torch.float32, torch.device("cpu"), gen)
    return kv._replace(key_cache=quantize(kv.key_cache, dtype).to(device),
                       value_cache=quantize(kv.value_cache, dtype).to(device),
                       block_tables=kv.block_tables.to(device), seq_lens=kv.seq_lens.to(device))


@pytest.mark.parametrize("dtype", FP8)
def test_store_into_fp8_matches_reference_bitwise(device, dtype):
    gen = torch.Generator().manual_seed(1)
    key = (torch.randn(9, 2, 32, generator=gen) * 40).to(device)
    value = (torch.randn(9, 2, 32, generator=gen) * 1e-3).to(device)  # e4m3's subnormals
    key[0, 0, :4] = torch.tensor([1e5, -1e5, 448.5, float(torch.finfo(dtype).max) * 1.01])
    slots = torch.tensor([3, -1, 0, 17, 30, -1, 5, 6, 12], device=device)
    got = [torch.zeros(4, 8, 2, 32, dtype=dtype, device=device) for _ in range(2)]
    want = [torch.zeros(4, 8, 2, 32, dtype=dtype) for _ in range(2)]
    store_kv_cache_triton(key, value, *got, slots)
    store_kv_cache_torch(key.cpu(), value.cpu(), *want, slots.cpu())
    for g, w in zip(got, want):
        assert torch.equal(g.cpu().view(torch.uint8), w.view(torch.uint8))
        assert torch.isfinite(g.cpu().float()).all()


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("num_splits", [1, 2])
def test_decode_over_fp8_cache_matches_dequantized_reference(device, dtype, num_splits):
    gen = torch.Generator().manual_seed(2)
    seq_lens = [1, 17, 150]
    kv = _fp8_kv(seq_lens, 64, 16, dtype, device, gen)
    query = torch.randn(len(seq_lens), 4, 64, generator=gen).to(device)
    out = poisoned_like(query)
    paged_decode_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, 0.125,
                                  max_seq_len=max(seq_lens), num_splits=num_splits, out=out)
    want = paged_decode_attention_torch(query.cpu(), kv.key_cache.cpu().float(), kv.value_cache.cpu().float(),
                                        kv.block_tables.cpu(), kv.seq_lens.cpu(), 0.125)
    assert_close(out, want, torch.float32)


@pytest.mark.parametrize("dtype", FP8)
def test_prefill_over_fp8_cache_matches_dequantized_reference(device, dtype):
    gen = torch.Generator().manual_seed(3)
    seq_lens, query_lens = [70, 9, 1], [30, 9, 1]
    kv = _fp8_kv(seq_lens, 32, 16, dtype, device, gen)
    starts = torch.tensor([0, 30, 39, 40], dtype=torch.int32, device=device)
    query = torch.randn(40, 4, 32, generator=gen).to(device)
    out = poisoned_like(query)
    paged_prefill_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, starts,
                                   32 ** -0.5, max_query_len=30, out=out)
    want = paged_prefill_attention_torch(query.cpu(), kv.key_cache.cpu().float(), kv.value_cache.cpu().float(),
                                         kv.block_tables.cpu(), kv.seq_lens.cpu(), starts.cpu(), 32 ** -0.5)
    assert_close(out, want, torch.float32)


@pytest.mark.parametrize("dtype", FP8)
def test_store_rounds_every_value_and_every_tie_as_torch(device, dtype):
    """Every finite fp8 value, every midpoint between neighbours (ties go to the even code), and the
    points just either side of each midpoint, through the store kernel's integer rounding."""
    values = fp8_values(dtype)
    pos = values[torch.isfinite(values) & (values >= 0)].unique().sort().values
    mids = (pos[1:] + pos[:-1]) / 2
    below, above = mids.nextafter(torch.tensor(0.0)), mids.nextafter(torch.tensor(1e9))
    x = torch.cat([pos, mids, below, above, torch.tensor([1e-12])])
    x = torch.cat([x, -x])
    n = -(-x.numel() // 32) * 32
    rows = torch.zeros(n)
    rows[:x.numel()] = x
    key = rows.view(-1, 1, 32).to(device)
    slots = torch.arange(key.shape[0], device=device)
    got = [torch.zeros(-(-key.shape[0] // 8), 8, 1, 32, dtype=dtype, device=device) for _ in range(2)]
    store_kv_cache_triton(key, key, *got, slots)
    want = rows.to(dtype)  # torch's round to nearest even (all within range)
    assert torch.equal(got[0].cpu().view(torch.uint8).reshape(-1)[:n], want.view(torch.uint8))
