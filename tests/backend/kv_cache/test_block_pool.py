"""Block pool and KV cache manager: ref counts, LRU free list, prefix hits, no leaks."""
from __future__ import annotations

import pytest

from kvserve.backend.engine.request import Request
from kvserve.backend.engine.sampling_params import SamplingParams
from kvserve.backend.kv_cache.block_pool import BlockPool, FreeBlockQueue, KVBlock
from kvserve.backend.kv_cache.manager import KVCacheManager


def _req(rid: str, tokens: list[int], key: str | None = "") -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), cache_key=key)


def test_free_queue_is_fifo_with_o1_removal_from_the_middle():
    blocks = [KVBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])
    assert [b.block_id for b in q] == [0, 1, 3, 4]
    assert q.popleft().block_id == 0
    q.append(blocks[2])
    assert [b.block_id for b in q] == [1, 3, 4, 2] and q.size == 4
    with pytest.raises(AssertionError):
        q.remove(blocks[0])  # not in the queue any more


def test_null_block_is_never_handed_out():
    pool = BlockPool(4)
    got = pool.get_new_blocks(3)
    assert sorted(b.block_id for b in got) == [1, 2, 3]
    assert pool.num_free_blocks == 0
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


def test_touched_blocks_count_each_block_once_and_fresh_ones_go_first():
    kv = KVCacheManager(num_blocks=9, block_size=4)
    a = _req("a", list(range(8)))
    assert kv.allocate_slots(a, 8) is not None and kv.pool.num_touched_blocks == 2
    kv.free(a)
    # A fresh block is handed out before a freed one (which keeps its prefix for a later hit).
    b = _req("b", list(range(100, 108)))
    kv.allocate_slots(b, 8)
    assert kv.pool.num_touched_blocks == 4
    kv.free(b)
    c = _req("c", list(range(200, 220)))
    kv.allocate_slots(c, 20)  # 4 fresh blocks, then the oldest freed one
    assert kv.pool.num_touched_blocks == 8 == kv.num_usable_blocks
    kv.free(c)
    kv.allocate_slots(_req("d", list(range(300, 332))), 32)  # all reused: nothing new is touched
    assert kv.pool.num_touched_blocks == 8


def test_allocate_and_free_return_every_block():
    kv = KVCacheManager(num_blocks=9, block_size=4)
    r = _req("a", list(range(10)))
    assert kv.allocate_slots(r, 10) is not None
    assert len(kv.block_ids("a")) == 3 and 0 not in kv.block_ids("a")
    assert kv.usage() == pytest.approx(3 / 8)
    r.num_computed_tokens = 10
    r.output_token_ids.append(5)
    assert kv.allocate_slots(r, 1) == [[]]  # 11 tokens still fit in 3 blocks (of the one KV group)
    kv.free(r)
    assert kv.num_free_blocks == 8 and kv.usage() == 0.0


def test_allocate_refuses_when_short_and_changes_nothing():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    r = _req("a", list(range(12)))
    assert kv.allocate_slots(r, 12) is None
    assert kv.num_free_blocks == 2 and kv.block_ids("a") == []


def test_prefix_hit_shares_blocks_and_caps_before_the_last_token():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _req("a", list(range(12)))
    kv.allocate_slots(a, 12)
    b = _req("b", list(range(12)))  # identical prompt: at most 2 of 3 blocks may hit
    hits, n = kv.get_computed_blocks(b)
    assert n == 8 and [h.block_id for h in hits[0]] == kv.block_ids("a")[:2]
    kv.allocate_slots(b, 4, hits)
    assert kv.block_ids("b")[:2] == kv.block_ids("a")[:2] and kv.block_ids("b")[2] != kv.block_ids("a")[2]
    assert kv.pool.blocks[kv.block_ids("a")[0]].ref_cnt == 2
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 15


def test_freed_prefix_stays_cached_until_evicted():
    kv = KVCacheManager(num_blocks=4, block_size=4)  # 3 usable
    a = _req("a", list(range(9)))
    kv.allocate_slots(a, 9)
    kv.free(a)
    b = _req("b", list(range(8)) + [99])
    hits, n = kv.get_computed_blocks(b)
    assert n == 8
    # A different prompt needing every block evicts the cached ones.
    c = _req("c", [7] * 12)
    assert kv.allocate_slots(c, 12) is not None
    assert kv.get_computed_blocks(_req("d", list(range(9))))[1] == 0


def test_salt_isolates_tenants_and_caching_off_shares_only_siblings():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _req("a", list(range(9)), key="tenant-a")
    kv.allocate_slots(a, 9)
    assert kv.get_computed_blocks(_req("b", list(range(9)), key="tenant-b"))[1] == 0
    assert kv.get_computed_blocks(_req("c", list(range(9)), key="tenant-a"))[1] == 8

    off = KVCacheManager(num_blocks=16, block_size=4, enable_caching=False)
    s1 = _req("p#0", list(range(9)), key="siblings:p")
    off.allocate_slots(s1, 9)
    assert off.get_computed_blocks(_req("p#1", list(range(9)), key="siblings:p"))[1] == 8
    assert off.get_computed_blocks(_req("x", list(range(9)), key=None))[1] == 0
    off.free(s1)
    assert off.get_computed_blocks(_req("p#2", list(range(9)), key="siblings:p"))[1] == 0


def test_tail_blocks_are_evicted_first():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(12)))
    kv.allocate_slots(a, 12)
    first, _, last = kv.block_ids("a")
    kv.free(a)
    order = [b.block_id for b in kv.pool.free_queue]
    assert order.index(last) < order.index(first)


def test_hash_collision_is_caught_by_the_token_check():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(9)))
    kv.allocate_slots(a, 9)
    block = kv.pool.blocks[kv.block_ids("a")[0]]
    block.token_ids = (9, 9, 9, 9)  # as if another prefix had produced the same hash
    assert kv.get_computed_blocks(_req("b", list(range(9))))[1] == 0
