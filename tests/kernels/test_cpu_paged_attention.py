"""The CPU path's per-step plans give the references' results layer after layer, step after step; the native decode kernel too."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from kernel_test_inputs import assert_close, make_paged_kv
from sliding_window_inputs import release_behind_window, windowed_reference

from kvserve.backend.worker.ops import TorchOps
from kvserve.kernels import cpu_native, cpu_paged_attention
from kvserve.kernels.kv_cache_store import store_kv_cache_torch
from kvserve.kernels.paged_attention_ref import paged_decode_attention_torch, paged_prefill_attention_torch
from kvserve.kernels.rotary import rotary_embedding_torch


def _meta(kv, query_lens):
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return SimpleNamespace(decode_only=max(query_lens) == 1, block_tables=kv.block_tables, seq_lens=kv.seq_lens,
                           query_start_loc=starts, max_seq_len=int(kv.seq_lens.max()),
                           max_query_len=max(query_lens))


def _reference(query, kv, meta):
    if meta.decode_only:
        return paged_decode_attention_torch(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, 0.125)
    return paged_prefill_attention_torch(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens,
                                         meta.query_start_loc, 0.125)


@pytest.mark.parametrize("query_lens", [[1, 1, 1, 1], [20, 1, 5, 1], [1, 33, 1, 1], [7, 3, 2, 40]])
def test_attention_equals_reference_across_layers_and_steps(query_lens, decode_path):
    """Decode-only steps on the torch path are bitwise the reference; prefill rows (SDPA's batched
    path) and the native kernel's decode rows are within float32 rounding."""
    gen = torch.Generator().manual_seed(len(query_lens) + sum(query_lens))
    ops = TorchOps()
    # Two "steps" with other lengths and tables: the second must not reuse the first's plan.
    for step, seq_lens in enumerate(([37, 5, 300, 40], [64, 17, 2, 129])):
        seq_lens = [max(s, q) for s, q in zip(seq_lens, query_lens)]
        kv = make_paged_kv(seq_lens, 3, 64, 16, torch.float32, torch.device("cpu"), gen)
        meta = _meta(kv, query_lens)
        for layer in range(3):  # every layer of a step shares the plan; its K/V and queries differ
            query = torch.randn(sum(query_lens), 9, 64, generator=gen)
            kv = kv._replace(key_cache=kv.key_cache + layer, value_cache=kv.value_cache * (layer + 1))
            got = ops.attention(query, kv.key_cache, kv.value_cache, meta, 0.125)
            want = _reference(query, kv, meta)
            if decode_path == "torch" and max(query_lens) == 1:
                assert torch.equal(got, want), (step, layer)
            else:
                assert_close(got, want, torch.float32)


@pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: the native kernel is not built")
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size",
                         [(9, 3, 64, 16), (8, 8, 32, 1), (32, 4, 128, 32), (4, 1, 80, 8),
                          # the vector path's shapes: head size 64, 128 or 256 with 1-4 query heads per
                          # kv head; cache blocks shorter and longer than its 16-token chunks
                          (6, 6, 64, 4), (8, 4, 64, 8), (4, 1, 64, 64), (8, 8, 128, 16), (16, 8, 128, 32),
                          (12, 4, 128, 16), (16, 4, 128, 8), (4, 1, 256, 16), (2, 1, 256, 32), (6, 2, 256, 4)])
def test_native_decode_kernel_matches_reference(num_heads, num_kv_heads, head_dim, block_size):
    gen = torch.Generator().manual_seed(num_heads * head_dim + block_size)
    seq_lens = [1, 2, block_size, block_size + 1, 300, 77]
    kv = make_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, torch.float32, torch.device("cpu"), gen)
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen)
    got = cpu_native.paged_decode(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, 0.1)
    want = paged_decode_attention_torch(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, 0.1)
    assert_close(got, want, torch.float32)


@pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: the native kernel is not built")
@pytest.mark.parametrize("seq_lens", [[1], [700], [33, 5]])
def test_native_decode_kernel_splits_few_requests_by_kv_head(seq_lens):
    """Fewer requests than twice the threads (one request: always): work items are (request, kv head) pairs."""
    gen = torch.Generator().manual_seed(sum(seq_lens))
    kv = make_paged_kv(seq_lens, 3, 64, 16, torch.float32, torch.device("cpu"), gen)
    query = torch.randn(len(seq_lens), 9, 64, generator=gen)
    got = cpu_native.paged_decode(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, 0.125)
    want = paged_decode_attention_torch(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, 0.125)
    assert_close(got, want, torch.float32)


@pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: the native kernel is not built")
def test_native_plan_refuses_tables_that_would_read_outside_the_cache():
    gen = torch.Generator().manual_seed(9)
    kv = make_paged_kv([40, 20], 2, 64, 16, torch.float32, torch.device("cpu"), gen)
    for tables, lens in ((kv.block_tables[:, :2], kv.seq_lens),          # 40 tokens need 3 blocks
                         (kv.block_tables + kv.key_cache.shape[0], kv.seq_lens),  # ids past the cache
                         (kv.block_tables, torch.tensor([40, 0], dtype=torch.int32))):  # empty context
        meta = SimpleNamespace(decode_only=True, block_tables=tables, seq_lens=lens,
                               query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32))
        with pytest.raises(ValueError, match="decode attention"):
            TorchOps().attention(torch.randn(2, 4, 64), kv.key_cache, kv.value_cache, meta, 0.125)


@pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: the native kernel is not built")
def test_short_prompt_chunks_attend_as_decode_rows_and_long_ones_through_sdpa(monkeypatch):
    """A chunk whose context is short joins the decode rows in the native kernel's one call, each of
    its positions one query over its own prefix; a long one (1,100 tokens of head size 64: past
    PREFILL_AS_ROWS_MAX_WORK) takes SDPA. Both give the reference's attention."""
    native_rows, sdpa_calls = [], []
    paged_decode, sdpa = cpu_native.paged_decode, cpu_paged_attention.F.scaled_dot_product_attention
    monkeypatch.setattr(cpu_native, "paged_decode", lambda query, *a: native_rows.append(query.shape[0])
                        or paged_decode(query, *a))
    monkeypatch.setattr(cpu_paged_attention.F, "scaled_dot_product_attention",
                        lambda *a, **k: sdpa_calls.append(1) or sdpa(*a, **k))
    gen = torch.Generator().manual_seed(5)
    query_lens, seq_lens = [1, 40, 1, 100, 7], [300, 60, 20, 1100, 7]  # the 40 start at 20, the 7 at 0
    kv = make_paged_kv(seq_lens, 3, 64, 16, torch.float32, torch.device("cpu"), gen)
    meta = _meta(kv, query_lens)
    query = torch.randn(sum(query_lens), 9, 64, generator=gen)
    want = _reference(query, kv, meta)
    sdpa_calls.clear()  # the reference's own
    got = TorchOps().attention(query, kv.key_cache, kv.value_cache, meta, 0.125)
    assert_close(got, want, torch.float32)
    assert native_rows == [1 + 40 + 1 + 7] and len(sdpa_calls) == 1


# Windows of 37 (never a multiple of the block size: the contexts' windows start mid-block) and 64
# (block-aligned starts for some); steps of decodes only, and decodes mixed with prefill chunks
# that start before and past the window.
@pytest.mark.parametrize("window", [37, 64])
@pytest.mark.parametrize("query_lens", [[1, 1, 1, 1], [1, 50, 1, 9]])
def test_sliding_window_attention_never_reads_behind_the_window(query_lens, window, decode_path, monkeypatch):
    """Against the windowed reference, with the blocks behind each first query's window pointing at a
    NaN null block; the native kernel takes the decode rows itself, however long the contexts."""
    native_calls, paged_decode = [], cpu_native.paged_decode

    def counted(*args):
        native_calls.append(args)
        return paged_decode(*args)

    monkeypatch.setattr(cpu_native, "paged_decode", counted)
    gen = torch.Generator().manual_seed(window + sum(query_lens))
    seq_lens = [300, 129, window + 1, 20]
    kv = make_paged_kv(seq_lens, 3, 64, 16, torch.float32, torch.device("cpu"), gen)
    query = torch.randn(sum(query_lens), 9, 64, generator=gen)
    expected = windowed_reference(query, kv, query_lens, 0.125, window)
    assert not torch.allclose(expected, windowed_reference(query, kv, query_lens, 0.125, None), atol=1e-2)
    released, num_released = release_behind_window(kv, query_lens, window)
    assert num_released > 0
    got = TorchOps().attention(query, released.key_cache, released.value_cache, _meta(released, query_lens), 0.125,
                               window)
    assert_close(got, expected, torch.float32)
    assert len(native_calls) == (decode_path == "native")


@pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: the native kernel is not built")
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size",
                         [(9, 3, 64, 16), (4, 1, 80, 8), (8, 8, 32, 1),
                          # the vector path's: its 16-token chunks must stop at the first block's end
                          (8, 4, 64, 8), (4, 1, 64, 64), (8, 8, 128, 32), (16, 8, 128, 16), (4, 1, 256, 16)])
@pytest.mark.parametrize("window", [1, 21, 64])
def test_native_decode_kernel_with_window(num_heads, num_kv_heads, head_dim, block_size, window):
    gen = torch.Generator().manual_seed(num_heads * head_dim + block_size + window)
    seq_lens = [1, window, window + 1, 300, 77, 2 * window + 5]
    kv = make_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, torch.float32, torch.device("cpu"), gen)
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen)
    query_lens = [1] * len(seq_lens)
    released, num_released = release_behind_window(kv, query_lens, window)
    assert num_released > 0
    got = cpu_native.paged_decode(query, released.key_cache, released.value_cache, released.block_tables,
                                  released.seq_lens, 0.1, window)
    assert_close(got, windowed_reference(query, kv, query_lens, 0.1, window), torch.float32)


@pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: the native kernel is not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size",
                         [(9, 3, 64, 16), (8, 2, 128, 8), (4, 1, 256, 32), (6, 6, 64, 4)])
@pytest.mark.parametrize("window", [0, 40])
def test_rows_that_read_one_context_get_the_bits_they_get_alone(dtype, num_heads, num_kv_heads, head_dim,
                                                                block_size, window):
    """A request verifying proposals brings consecutive rows over one block table (lengths p + 1, p + 2,
    ...), which the kernel attends together, reading the context once. Each row must come out with
    the bits it has alone in a plain decode step, so that a verified token is the one plain decoding
    picks: runs that end inside and on the edge of a 16-token chunk, a run longer than the kernel's
    16 rows, single rows between runs, and (with a window) rows that start past position 0."""
    gen = torch.Generator().manual_seed(num_heads * head_dim + block_size + window)
    kv = make_paged_kv([320, 90], num_kv_heads, head_dim, block_size, torch.float32, torch.device("cpu"), gen)
    key_cache, value_cache = kv.key_cache.to(dtype), kv.value_cache.to(dtype)
    rows = [(0, n) for n in (15, 16, 17, 18, 33)] + [(1, 90)] + [(0, n) for n in range(31, 50)] + [(1, 1), (1, 2)]
    tables = kv.block_tables[[r for r, _ in rows]].contiguous()
    lens = torch.tensor([n for _, n in rows], dtype=torch.int32)
    query = torch.randn(len(rows), num_heads, head_dim, generator=gen)
    together = cpu_native.paged_decode(query, key_cache, value_cache, tables, lens, 0.125, window=window)
    for i in range(len(rows)):
        alone = cpu_native.paged_decode(query[i:i + 1], key_cache, value_cache, tables[i:i + 1], lens[i:i + 1], 0.125,
                                        window=window)
        assert torch.equal(alone[0], together[i]), i
    if not window:  # (the windowed rows alone are checked against the reference above)
        want = paged_decode_attention_torch(query, key_cache.float(), value_cache.float(), tables, lens, 0.125)
        assert_close(together, want, torch.float32)


@pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: the native kernel is not built")
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size",
                         [(9, 3, 64, 16), (4, 1, 256, 32), (8, 2, 128, 8)])
@pytest.mark.parametrize("window", [0, 100])
def test_a_row_has_the_same_bits_whether_its_partitions_run_on_one_thread_or_several(num_heads, num_kv_heads, head_dim,
                                                                                     block_size, window):
    """The vector path's softmax runs over fixed 64-position partitions of a context, folded in
    order. A step of one or two requests spreads their partitions over the threads; a fuller step
    runs each request's on one thread. A row must get the same bits either way, so that its token
    does not depend on what else the step holds: contexts ending inside, on and past partition
    edges, and windows that start inside a partition."""
    gen = torch.Generator().manual_seed(num_heads * head_dim + block_size + window)
    lens = [1, 63, 64, 65, 128, 129, 200, 333]
    kv = make_paged_kv(lens, num_kv_heads, head_dim, block_size, torch.float32, torch.device("cpu"), gen)
    query = torch.randn(len(lens), num_heads, head_dim, generator=gen)

    def attend(rows: slice) -> torch.Tensor:
        return cpu_native.paged_decode(query[rows], kv.key_cache, kv.value_cache, kv.block_tables[rows].contiguous(),
                                       kv.seq_lens[rows].contiguous(), 0.125, window=window)

    together = attend(slice(0, len(lens)))  # 8 requests: each on one thread
    for i in range(len(lens)):
        assert torch.equal(attend(slice(i, i + 1)), together[i:i + 1]), f"alone, length {lens[i]}"
        if i + 1 < len(lens):
            assert torch.equal(attend(slice(i, i + 2)), together[i:i + 2]), f"in a pair, length {lens[i]}"
    want = (windowed_reference(query, kv, [1] * len(lens), 0.125, window) if window
            else paged_decode_attention_torch(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, 0.125))
    assert_close(together, want, torch.float32)


def test_store_kv_equals_reference_with_skipped_slots():
    gen = torch.Generator().manual_seed(3)
    ops = TorchOps()
    for slots in ([3, -1, 0, 9, 15, 4], [1, 2, 5, 6, 7, 8], [-1] * 6):
        slots = torch.tensor(slots, dtype=torch.int64)
        for _ in range(2):
            key, value = torch.randn(2, 6, 2, 64, generator=gen)
            got = [torch.zeros(2, 8, 2, 64) for _ in range(2)]
            want = [torch.zeros(2, 8, 2, 64) for _ in range(2)]
            ops.store_kv(key, value, *got, slots)
            store_kv_cache_torch(key, value, *want, slots)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_equals_reference_when_positions_change(is_neox):
    gen = torch.Generator().manual_seed(4)
    ops = TorchOps()
    cos_sin = torch.randn(64, 32, generator=gen)  # rotary_dim 32 of head size 64
    for positions in ([0, 5, 17, 2], [9, 9, 63, 1]):
        positions = torch.tensor(positions)
        for _ in range(2):
            q, k = torch.randn(4, 6, 64, generator=gen), torch.randn(4, 2, 64, generator=gen)
            q2, k2 = q.clone(), k.clone()
            ops.rotary(positions, q, k, cos_sin, is_neox)
            rotary_embedding_torch(positions, q2, k2, cos_sin, is_neox)
            assert torch.equal(q, q2) and torch.equal(k, k2)
