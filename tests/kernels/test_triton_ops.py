"""TritonOps offers TorchOps' interface and gives its results, method by method."""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from kernel_test_inputs import assert_close, make_paged_kv

from kvserve.backend.worker.ops import TorchOps
from kvserve.kernels.triton_ops import TritonOps


def _public_methods(cls):
    return {name: inspect.signature(fn) for name, fn in vars(cls).items()
            if callable(fn) and not name.startswith("_")}


def test_same_interface_as_torch_ops():
    assert _public_methods(TritonOps) == _public_methods(TorchOps)


@pytest.mark.parametrize("window", [None, 20])  # 20: shorter than two of the three contexts
@pytest.mark.parametrize("decode_only", [True, False])
def test_attention_matches_torch_ops(device, decode_only, window):
    gen = torch.Generator().manual_seed(0)
    seq_lens = [37, 5, 300]
    query_lens = [1, 1, 1] if decode_only else [20, 5, 1]
    kv = make_paged_kv(seq_lens, 2, 64, 16, torch.float32, device, gen)
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    meta = SimpleNamespace(decode_only=decode_only, block_tables=kv.block_tables, seq_lens=kv.seq_lens,
                           query_start_loc=starts, max_seq_len=max(seq_lens), max_query_len=max(query_lens))
    query = torch.randn(sum(query_lens), 8, 64, generator=gen).to(device)
    got = TritonOps().attention(query, kv.key_cache, kv.value_cache, meta, 0.125, window)
    want = TorchOps().attention(query, kv.key_cache, kv.value_cache, meta, 0.125, window)
    assert_close(got, want, torch.float32)


def test_store_norm_rotary_match_torch_ops(device):
    gen = torch.Generator().manual_seed(1)
    ops, ref = TritonOps(), TorchOps()
    key, value = torch.randn(2, 6, 2, 64, generator=gen).to(device)
    slots = torch.tensor([3, -1, 0, 9, 15, 4], dtype=torch.int64, device=device)
    caches = [torch.zeros(2, 8, 2, 64, device=device) for _ in range(4)]
    ops.store_kv(key, value, caches[0], caches[1], slots)
    ref.store_kv(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])

    x, residual = torch.randn(2, 6, 128, generator=gen).to(device)
    weight = torch.randn(128, generator=gen).to(device)
    assert_close(ops.rms_norm(x, weight, 1e-5), ref.rms_norm(x, weight, 1e-5), torch.float32)
    for got, want in zip(ops.rms_norm(x, weight, 1e-5, residual), ref.rms_norm(x, weight, 1e-5, residual)):
        assert_close(got, want, torch.float32)

    positions = torch.tensor([0, 5, 17, 2, 2, 31], device=device)
    cos_sin = torch.randn(32, 64, generator=gen).to(device)
    q, k = torch.randn(6, 4, 64, generator=gen).to(device), torch.randn(6, 2, 64, generator=gen).to(device)
    q2, k2 = q.clone(), k.clone()
    ops.rotary(positions, q, k, cos_sin, False)
    ref.rotary(positions, q2, k2, cos_sin, False)
    assert_close(q, q2, torch.float32)
    assert_close(k, k2, torch.float32)
