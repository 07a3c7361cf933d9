"""Compressed KV caches on the CPU path (fp8 e4m3 / e5m2, bfloat16): quantize on write, widen on read.

Every attention result is compared with the torch reference run on the *dequantized* caches (the
float32 values the fp8 bytes stand for): dequantizing is exact, so the kernels must agree with it to
float32 rounding, and the only cost of fp8 is the rounding at the store, which the quantize tests pin.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from kernel_test_inputs import assert_close, make_paged_kv
from sliding_window_inputs import windowed_reference

from kvserve.backend.worker.ops import TorchOps
from kvserve.kernels import cpu_native
from kvserve.kernels.kv_cache_store import store_kv_cache_torch
from kvserve.kernels.kv_quant import fp8_max, fp8_values, quantize
from kvserve.kernels.paged_attention_ref import paged_prefill_attention_torch

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
COMPRESSED = [*FP8, torch.bfloat16]
native_only = pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: the native kernel is not built")


def _quantized(kv, dtype):
    return kv._replace(key_cache=quantize(kv.key_cache, dtype), value_cache=quantize(kv.value_cache, dtype))


def _dequantized(kv):
    return kv._replace(key_cache=kv.key_cache.float(), value_cache=kv.value_cache.float())


def _all_codes(dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bfloat16:
        return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)


@native_only
@pytest.mark.parametrize("dtype", COMPRESSED)
def test_native_widening_is_torchs_on_every_code(dtype):
    """The decode kernel's two ways of widening (16 at a time in vector registers, one at a time
    through the format's table) give torch's value for every code, subnormals and signs included."""
    codes = _all_codes(dtype)
    want = codes.float()
    vectors = cpu_native.kv_to_f32(codes)  # whole 16-value loads where the CPU has a vector path
    one_by_one = torch.cat([cpu_native.kv_to_f32(codes[i:i + 1]) for i in range(codes.numel())]) \
        if dtype != torch.bfloat16 else cpu_native.kv_to_f32(codes[:15])  # the scalar tail
    if dtype == torch.float8_e4m3fn and cpu_native.linear_available():
        # e4m3fn's two NaN codes (never written: stores clamp) read as +-480 in vector registers;
        # a build without a vector path (AVX-512, or AVX2 + FMA + F16C) widens every code through the table, NaN as torch does.
        nan = want.isnan()
        assert int(nan.sum()) == 2 and torch.equal(vectors[nan].abs(), torch.full((2,), 480.0))
        vectors, want_v = vectors[~nan], want[~nan]
    else:
        want_v = want
    torch.testing.assert_close(vectors, want_v, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(one_by_one, want[:one_by_one.numel()], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", FP8)
def test_quantize_rounds_to_nearest_and_clamps_beyond_the_range(dtype):
    limit = fp8_max(dtype)
    x = torch.tensor([0.0, 0.3, -1.7, 3e-3, limit * 0.99, limit * 4, -limit * 4, 1e30])
    q = quantize(x, dtype)
    assert q.dtype == dtype and torch.isfinite(q.float()).all()
    assert q.float()[-3:].tolist() == [limit, -limit, limit]
    # Inside the range: torch's own round-to-nearest conversion, no scale.
    assert torch.equal(q.float()[:5], x[:5].to(dtype).float())
    # Unclamped, torch turns what is out of e5m2's range into inf (and e4m3fn's into NaN on some
    # versions and devices; 2.13's CPU conversion saturates): what the clamp prevents everywhere.
    if dtype == torch.float8_e5m2:
        assert torch.isinf(x[-3:].to(dtype).float()).all()
    # Every code's value quantizes to itself (the round trip is exact).
    values = fp8_values(dtype)
    finite = torch.isfinite(values)
    assert torch.equal(quantize(values[finite], dtype).float(), values[finite])


@pytest.mark.parametrize("dtype", COMPRESSED)
@pytest.mark.parametrize("store", ["plan", "reference"])
def test_store_writes_the_quantized_rows_and_skips_minus_one(dtype, store):
    gen = torch.Generator().manual_seed(3)
    key = torch.randn(6, 2, 16, generator=gen) * 50  # some of e4m3's would-be NaNs among them
    key[0, 0, 0] = 1e4
    value = torch.randn(6, 2, 16, generator=gen)
    slots = torch.tensor([5, -1, 17, 0, -1, 30])
    kc, vc = (torch.zeros(4, 8, 2, 16, dtype=dtype) for _ in range(2))
    if store == "plan":
        TorchOps().store_kv(key, value, kc, vc, slots)
    else:
        store_kv_cache_torch(key, value, kc, vc, slots)
    valid = slots >= 0
    for src, cache in ((key, kc), (value, vc)):
        flat = cache.view(32, 2, 16)
        assert torch.equal(flat[slots[valid]].float(), quantize(src[valid], dtype).float())
        untouched = torch.ones(32, dtype=torch.bool)
        untouched[slots[valid]] = False
        assert not flat[untouched].float().any()
        assert torch.isfinite(flat.float()).all()


@native_only
@pytest.mark.parametrize("dtype", COMPRESSED)
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size",
                         [(9, 3, 64, 16),    # SmolLM2's shape: the vector path, group 3
                          (8, 8, 128, 16),   # vector path, head size 128
                          (16, 8, 128, 32),  # vector path, head size 128, group 2
                          (4, 1, 80, 8),     # the scalar loops (head size 80)
                          (8, 2, 16, 4)])    # the scalar loops (the tiny test model's head size)
@pytest.mark.parametrize("window", [None, 21])
def test_native_decode_over_a_compressed_cache_matches_the_dequantized_reference(
        dtype, num_heads, num_kv_heads, head_dim, block_size, window):
    gen = torch.Generator().manual_seed(num_heads * head_dim + block_size)
    seq_lens = [1, block_size + 1, 300, 77]
    kv = _quantized(make_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, torch.float32,
                                  torch.device("cpu"), gen), dtype)
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen)
    got = cpu_native.paged_decode(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, 0.1, window)
    assert_close(got, windowed_reference(query, _dequantized(kv), [1] * len(seq_lens), 0.1, window), torch.float32)


@pytest.mark.parametrize("dtype", COMPRESSED)
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [20, 1, 5]])
def test_torch_ops_attention_over_a_compressed_cache(dtype, query_lens, decode_path):
    """What the CPU engine runs: decodes (native kernel or gathered SDPA) and prefill chunks (gathered
    rows converted to the query's dtype) against the reference on the dequantized cache."""
    gen = torch.Generator().manual_seed(sum(query_lens))
    seq_lens = [max(s, q) for s, q in zip([37, 5, 300], query_lens)]
    kv = _quantized(make_paged_kv(seq_lens, 3, 64, 16, torch.float32, torch.device("cpu"), gen), dtype)
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    meta = SimpleNamespace(decode_only=max(query_lens) == 1, block_tables=kv.block_tables, seq_lens=kv.seq_lens,
                           query_start_loc=starts, max_seq_len=max(seq_lens), max_query_len=max(query_lens))
    query = torch.randn(sum(query_lens), 9, 64, generator=gen)
    got = TorchOps().attention(query, kv.key_cache, kv.value_cache, meta, 0.125)
    ref = _dequantized(kv)
    want = paged_prefill_attention_torch(query, ref.key_cache, ref.value_cache, ref.block_tables, ref.seq_lens,
                                         starts, 0.125)
    assert_close(got, want, torch.float32)
    # ... and the compression is visible: the float32 cache it came from gives another result.
    exact = make_paged_kv(seq_lens, 3, 64, 16, torch.float32, torch.device("cpu"),
                          torch.Generator().manual_seed(sum(query_lens)))
    assert not torch.equal(got, paged_prefill_attention_torch(query, exact.key_cache, exact.value_cache,
                                                              exact.block_tables, exact.seq_lens, starts, 0.125))
