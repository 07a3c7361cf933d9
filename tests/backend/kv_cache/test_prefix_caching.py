"""Prefix caching gives the same greedy tokens as no caching, reuses blocks, isolates salts."""
from __future__ import annotations

import random

import pytest

from kvserve.backend import LLM, SamplingParams

BS = 16
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def engines(llama_dir):
    on = LLM(model=llama_dir, block_size=BS, max_model_len=512, enable_prefix_caching=True)
    off = LLM(model=llama_dir, block_size=BS, max_model_len=512, enable_prefix_caching=False)
    return on, off


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def _prompts(shared_len: int, count: int = 4, tail: int = 9, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 500) for _ in range(shared_len)]
    return [shared + [rng.randrange(3, 500) for _ in range(tail)] for _ in range(count)]


@pytest.mark.parametrize("shared_len", [0, BS, 5 * BS + 3])
def test_same_tokens_with_and_without_caching(engines, shared_len):
    on, off = engines
    prompts = _prompts(shared_len, seed=shared_len)
    first = on.generate(prompts[:1], GREEDY)  # warm the cache with one of them
    outs_on = on.generate(prompts, GREEDY)
    assert _tokens(outs_on) == _tokens(off.generate(prompts, GREEDY))
    assert _tokens(first) == _tokens(outs_on[:1])
    expected = (shared_len // BS) * BS
    assert all(o.num_cached_tokens >= expected for o in outs_on[1:])
    assert all(o.num_cached_tokens == 0 for o in off.generate(prompts, GREEDY))


def test_prompt_ending_on_a_block_boundary(engines):
    on, off = engines
    prompt = _prompts(4 * BS, count=1, tail=0, seed=3)[0]
    assert len(prompt) % BS == 0
    a = on.generate([prompt], GREEDY)[0]
    b = on.generate([prompt], GREEDY)[0]
    assert b.num_cached_tokens == 3 * BS  # the last block is recomputed to produce logits
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == off.generate([prompt], GREEDY)[0].outputs[0].token_ids


def test_two_requests_racing_on_the_same_new_prefix(engines):
    on, off = engines
    prompts = _prompts(6 * BS, count=2, tail=4, seed=9)
    outs = on.generate(prompts, GREEDY)  # both admitted in the same step
    assert _tokens(outs) == _tokens(off.generate(prompts, GREEDY))
    kv = on.engine.kv
    assert kv.num_free_blocks == kv.num_usable_blocks


def test_salts_isolate_tenants(engines):
    on, _ = engines
    prompt = _prompts(5 * BS, count=1, seed=21)[0]
    salted = lambda s: SamplingParams(max_tokens=4, temperature=0, cache_salt=s)  # noqa: E731
    on.generate([prompt], salted("tenant-a"))
    assert on.generate([prompt], salted("tenant-b"))[0].num_cached_tokens == 0
    assert on.generate([prompt], salted("tenant-a"))[0].num_cached_tokens > 0
    assert on.generate([prompt], SamplingParams(max_tokens=4))[0].num_cached_tokens == 0


def test_eviction_under_a_small_budget_keeps_tokens_right(llama_dir, engines):
    _, off = engines
    small = LLM(model=llama_dir, block_size=BS, max_model_len=256, num_kv_blocks=24, max_num_seqs=4)
    prompts = [p for seed in range(6) for p in _prompts(5 * BS, count=2, tail=7, seed=100 + seed)]
    for p in prompts:  # one at a time so earlier prefixes get evicted by later ones
        assert _tokens(small.generate([p], GREEDY)) == _tokens(off.generate([p], GREEDY))
    assert _tokens(small.generate(prompts, GREEDY)) == _tokens(off.generate(prompts, GREEDY))
    kv = small.engine.kv
    assert kv.num_free_blocks == kv.num_usable_blocks


def test_quarter_budget_64_requests_complete_with_preemptions(llama_dir, engines):
    _, off = engines
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(8, 40))] for _ in range(64)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    need_blocks = sum(-(-(len(p) + 16) // BS) for p in prompts)
    tight = LLM(model=llama_dir, block_size=BS, max_model_len=64, num_kv_blocks=need_blocks // 4 + 1,
                max_num_seqs=64)
    outs = tight.generate(prompts, params)
    assert _tokens(outs) == _tokens(off.generate(prompts, params))
    assert tight.engine.scheduler.num_preemptions_total > 0
    assert tight.engine.stats().num_preemptions_total == tight.engine.scheduler.num_preemptions_total


def test_max_model_len_beyond_the_kv_budget_is_refused(llama_dir):
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(model=llama_dir, max_model_len=512, num_kv_blocks=8, block_size=BS)


def test_the_runner_block_table_follows_the_kv_manager_through_preemption_and_sharing(llama_dir):
    """The KV manager owns the block ids; the runner rebuilds each table from new ids only.
    After every step, every running request's table in the runner is the manager's."""
    rng = random.Random(9)
    shared = [rng.randrange(3, 500) for _ in range(2 * BS)]
    prompts = [shared + [rng.randrange(3, 500) for _ in range(rng.randint(1, 60))] for _ in range(24)]
    tight = LLM(model=llama_dir, block_size=BS, max_model_len=128, num_kv_blocks=24, max_num_seqs=16)
    eng = tight.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
        for req in eng.scheduler.running:
            assert eng.runner.block_tables[req.request_id][0] == eng.kv.block_ids(req.request_id), (steps, req.request_id)
    assert eng.scheduler.num_preemptions_total > 0 and eng.kv.prefix_hits > 0
    eng.step()  # an empty step still tells the runner who finished
    assert eng.runner.block_tables == {}


def test_reset_forgets_every_prefix_while_a_running_request_goes_on(engines):
    """vLLM's reset_prefix_cache: no later prompt reuses what was cached before it, a request
    running across it keeps its blocks and its tokens, and caching works again afterwards."""
    on, off = engines
    prompt = _prompts(4 * BS, count=1, tail=5, seed=31)[0]
    on.generate([prompt], GREEDY)
    assert on.generate([prompt], GREEDY)[0].num_cached_tokens == 4 * BS
    engine = on.engine
    engine.add_request("across-the-reset", prompt, GREEDY)
    tokens = [t for out in engine.step() + engine.step() for t in out.outputs[0].token_ids]
    assert engine.has_unfinished() and 0 < len(tokens) < GREEDY.max_tokens
    assert engine.reset_prefix_cache() >= 4
    assert engine.kv.pool.cached == {}
    while engine.has_unfinished():
        tokens += [t for out in engine.step() for t in out.outputs[0].token_ids]
    assert tokens == _tokens(off.generate([prompt], GREEDY))[0]
    assert on.generate([prompt], GREEDY)[0].num_cached_tokens == 0  # nothing cached before the reset is hit
    assert on.generate([prompt], GREEDY)[0].num_cached_tokens == 4 * BS  # and caching goes on
    assert on.reset_prefix_cache() is True
    assert engine.kv.num_free_blocks == engine.kv.num_usable_blocks
