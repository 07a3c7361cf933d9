"""KV cache groups: how layers are grouped by attention type, and what a sliding group lets go."""
from __future__ import annotations

from kvserve.backend.engine import Request, SamplingParams
from kvserve.backend.kv_cache import KVCacheGroup, KVCacheManager, blocks_for_request, layer_slots, plan_groups
from kvserve.backend.models.arch_config import gemma3_layer_types


def _req(rid: str, tokens: list[int], key: str | None = "") -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), cache_key=key)


def _gemma3_windows(num_layers: int = 18, window: int = 512) -> list[int | None]:
    return [None if t == "full_attention" else window for t in gemma3_layer_types(num_layers)]


def test_gemma3_270m_is_six_groups_of_three_layers() -> None:
    groups = plan_groups(_gemma3_windows())
    assert [g.window for g in groups] == [None] + [512] * 5
    assert groups[0].layers == (5, 11, 17) and groups[1].layers == (0, 1, 2)
    slots = layer_slots(groups, 18)
    assert slots[5] == (0, 0) and slots[17] == (0, 2) and slots[4] == (2, 1)
    assert sorted(layer for g in groups for layer in g.layers) == list(range(18))


def test_one_kind_is_one_group_and_uneven_counts_use_their_gcd() -> None:
    assert plan_groups([None] * 4) == [KVCacheGroup((0, 1, 2, 3), None)]
    assert plan_groups([8] * 3) == [KVCacheGroup((0, 1, 2), 8)]
    assert [g.layers for g in plan_groups([None, 8, 8, 8, None, 8])] == [(0, 4), (1, 2), (3, 5)]


def _run_long_request(kv: KVCacheManager, num_tokens: int, chunk: int, decode_steps: int) -> Request:
    req = _req("long", list(range(num_tokens)))
    while req.num_computed_tokens < num_tokens:
        n = min(chunk, num_tokens - req.num_computed_tokens)
        assert kv.allocate_slots(req, n) is not None
        req.num_computed_tokens += n
    for i in range(decode_steps):
        req.output_token_ids.append(i)
        assert kv.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1
    return req


def test_an_8000_token_request_on_gemma3_holds_under_03x_the_full_attention_blocks() -> None:
    """Issue #29's memory line: a block id of a group is a block of its 3 layers; full attention on
    all 18 layers would hold ceil(8000 / 16) blocks of each layer."""
    groups = plan_groups(_gemma3_windows())
    kv = KVCacheManager(num_blocks=4000, block_size=16, groups=groups)
    req = _run_long_request(kv, 7990, chunk=2048, decode_steps=10)
    held_layer_blocks = kv.num_held_blocks(req.request_id) * len(groups[0].layers)
    full_everywhere = -(-8000 // 16) * 18
    assert held_layer_blocks <= 0.3 * full_everywhere, (held_layer_blocks, full_everywhere)
    assert kv.num_held_blocks(req.request_id) <= blocks_for_request(groups, 8000, 16)
    # The full group keeps everything, each sliding group about a window's worth.
    assert len(kv.block_ids(req.request_id, 0)) == 500
    assert all(len(kv.block_ids(req.request_id, g)) <= 512 // 16 + 1 for g in range(1, 6))
    kv.free(req)
    assert kv.num_free_blocks == kv.num_usable_blocks


def test_sliding_blocks_return_to_the_pool_while_the_request_runs() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4, groups=[KVCacheGroup((0,), None), KVCacheGroup((1,), 8)])
    req = _req("a", list(range(40)))
    assert kv.allocate_slots(req, 40) is not None  # the prefill step needs all of it
    assert len(kv.block_ids("a", 1)) == 10
    req.num_computed_tokens = 40
    req.output_token_ids.append(1)
    new = kv.allocate_slots(req, 1)
    assert new == [[kv.block_ids("a", 0)[-1]], [kv.block_ids("a", 1)[-1]]]  # position 40 opens block 10
    # Position 40 sees 33..40: blocks 8 (32..35) to 10; blocks 0..7 of the sliding group are free again.
    assert len(kv.block_ids("a", 1)) == 3 and len(kv.block_ids("a", 0)) == 11
    assert kv.num_free_blocks == 63 - 14


def test_a_prefix_hit_needs_every_group_and_skips_what_the_window_does_not_see() -> None:
    groups = [KVCacheGroup((0,), None), KVCacheGroup((1,), 8)]
    kv = KVCacheManager(num_blocks=64, block_size=4, groups=groups)
    a = _req("a", list(range(40)))
    kv.allocate_slots(a, 40)
    kv.free(a)  # both groups' blocks stay indexed in the free list
    b = _req("b", list(range(40)) + [7])
    hits, n = kv.get_computed_blocks(b)
    assert n == 40 and len(hits[0]) == len(hits[1]) == 10
    free_before = kv.num_free_blocks
    assert kv.allocate_slots(b, 1, hits) is not None
    # The full group took all ten hits; the sliding one only the blocks position 40 can see (8, 9).
    assert len(kv.block_ids("b", 0)) == 11 and len(kv.block_ids("b", 1)) == 3
    assert free_before - kv.num_free_blocks == 14
    kv.free(b)
    # A prompt whose sliding blocks were evicted meanwhile gets no hit at all.
    kv2 = KVCacheManager(num_blocks=64, block_size=4, groups=groups)
    c = _req("c", list(range(40)))
    kv2.allocate_slots(c, 40)
    for block in list(kv2._reqs["c"].tables[1]):
        kv2.pool._evict(block)
    assert kv2.get_computed_blocks(_req("d", list(range(40)) + [1]))[1] == 0


def test_fresh_blocks_never_come_from_another_groups_hits() -> None:
    """Hits sit in the free list: drawing group 0's fresh blocks must not evict (and hand out) a
    block group 1 is about to take as its hit."""
    groups = [KVCacheGroup((0,), None), KVCacheGroup((1,), None)]
    kv = KVCacheManager(num_blocks=9, block_size=4, groups=groups)  # 8 usable
    x, a = _req("x", [9] * 8), _req("a", list(range(8)))
    kv.allocate_slots(x, 8)
    kv.allocate_slots(a, 8)
    kv.free(a)  # free list: a's group-0 blocks, then its group-1 blocks
    kv.free(x)
    c = _req("c", list(range(4)) + [50] * 9)
    hits, n = kv.get_computed_blocks(c)
    assert n == 4
    assert kv.allocate_slots(c, 9, hits) is not None  # 3 fresh blocks per group, 6 free besides the hits
    held = [b for g in range(2) for b in kv.block_ids("c", g)]
    assert len(held) == 8 and len(set(held)) == 8, held
    assert all(kv.pool.blocks[b].ref_cnt == 1 for b in held)
