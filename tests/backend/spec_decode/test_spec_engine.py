"""Speculative decoding through the engine on the tiny random model, for each method (n-gram and
suffix): greedy output is token for token what plain decoding gives (plain, chunked prefill, prefix
hits, preemption, stops inside an accepted run), seeded sampling keeps the target distribution, and
a proposer fault costs nothing.

Every test asserts that proposals were accepted, so none can pass with speculation idle."""
from __future__ import annotations

import math

import pytest

from kvserve.backend import LLM, SamplingParams

# The load policy is off: these tests are about verification (test_spec_policy.py runs it on).
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
         "load_policy": "off"}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 8, "load_policy": "off"}
METHODS = pytest.mark.parametrize("spec_config", [NGRAM, SUFFIX], ids=["ngram", "suffix"])
GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
# Text that repeats, so prompt lookup finds something to propose; the tiny model's greedy output
# falls into loops of its own, which lookup then proposes from the output.
PROMPTS = [
    "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat",
    "Once upon a time there was a dog. Once upon a time there was a dog. Once upon a",
    "def add(a, b): return a + b\ndef add(a, b): return a + b\ndef add(",
    "one two three four five one two three four five one two three",
]


def _engines(llama_dir, spec_config=NGRAM, **args):
    base = LLM(model=llama_dir, max_model_len=256, **args)
    spec = LLM(model=llama_dir, max_model_len=256, speculative_config=spec_config, **args)
    return base, spec


def _tokens(llm, prompts=PROMPTS, params=GREEDY):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _accepted(llm) -> int:
    return llm.engine.speculator.counters.num_accepted_tokens


def _all_free(llm) -> bool:
    kv = llm.engine.kv
    return kv.num_free_blocks == kv.num_usable_blocks and not llm.engine.groups


@pytest.fixture(scope="module", params=[NGRAM, SUFFIX], ids=["ngram", "suffix"])
def plain_pair(llama_dir, request):
    return _engines(llama_dir, request.param, max_num_seqs=8, enable_prefix_caching=False)


def test_greedy_with_speculation_equals_without(plain_pair):
    base, spec = plain_pair
    assert _tokens(spec) == _tokens(base)
    assert _accepted(spec) > 0
    stats = spec.engine.stats()
    assert stats.spec_decode_num_accepted_tokens_total == _accepted(spec)
    assert 0 < stats.spec_decode_num_accepted_tokens_total <= stats.spec_decode_num_draft_tokens_total
    assert stats.spec_decode_num_drafts_total > 0 and stats.spec_decode_proposer_errors_total == 0
    assert _all_free(spec)


def test_greedy_one_request_at_a_time(plain_pair):
    base, spec = plain_pair
    for prompt in PROMPTS:
        assert _tokens(spec, [prompt]) == _tokens(base, [prompt])


def test_stops_inside_an_accepted_run_end_the_request_there(plain_pair):
    base, spec = plain_pair
    before = _accepted(spec)
    for max_tokens in (1, 2, 3, 5, 8, 13):
        p = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        assert _tokens(spec, params=p) == _tokens(base, params=p)
    full = base.generate(PROMPTS, GREEDY)
    for out in full:
        ids, text = out.outputs[0].token_ids, out.outputs[0].text
        stop_token = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop_token_ids=[ids[7]])
        got = spec.generate(out.prompt, stop_token)[0].outputs[0]
        assert got.token_ids == ids[:ids.index(ids[7]) + 1] and got.finish_reason == "stop"
        stop = text[len(text) // 2:len(text) // 2 + 3]
        if stop.strip():
            with_stop = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop=[stop])
            want = base.generate(out.prompt, with_stop)[0].outputs[0]
            got = spec.generate(out.prompt, with_stop)[0].outputs[0]
            assert (got.text, got.token_ids, got.finish_reason) == (want.text, want.token_ids, want.finish_reason)
    assert _accepted(spec) > before
    assert _all_free(spec)


@METHODS
def test_greedy_with_chunked_prefill(spec_config, llama_dir):
    # A 24-token budget: prompts arrive in chunks beside other requests' decodes and proposals.
    base, spec = _engines(llama_dir, spec_config, max_num_seqs=8, max_num_batched_tokens=24,
                          enable_prefix_caching=False)
    assert _tokens(spec) == _tokens(base)
    assert _accepted(spec) > 0


@METHODS
def test_greedy_with_prefix_caching(spec_config, llama_dir):
    base, spec = _engines(llama_dir, spec_config, max_num_seqs=8, enable_prefix_caching=True)
    shared = PROMPTS[0] + " " + PROMPTS[1]
    prompts = [shared + " and then", shared + " but", *PROMPTS]
    want = _tokens(base, prompts)
    first = _tokens(spec, prompts)
    # Again: every full block of each prompt is now a hit, including blocks that held proposals.
    again = _tokens(spec, prompts)
    assert first == want and again == want
    assert spec.engine.kv.prefix_hits > 0 and _accepted(spec) > 0
    # Generated text is cached too: a prompt that extends an earlier output hits past its prompt.
    out = spec.generate(PROMPTS[0], GREEDY)[0]
    follow = out.prompt_token_ids + out.outputs[0].token_ids
    assert _tokens(spec, [follow]) == _tokens(base, [follow])
    assert spec.generate(follow, GREEDY)[0].num_cached_tokens >= 16 * ((len(follow) - 1) // 16) - 16
    assert _all_free(spec)


@METHODS
def test_greedy_with_preemption(spec_config, llama_dir):
    # 20 blocks of 16 tokens for 4 requests of ~20-30 prompt + 60 output tokens each: preemptions.
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    base, spec = _engines(llama_dir, spec_config, max_num_seqs=4, num_kv_blocks=20, enable_prefix_caching=False)
    want = _tokens(base, params=params)
    assert _tokens(spec, params=params) == want
    assert spec.engine.scheduler.num_preemptions_total > 0 and _accepted(spec) > 0
    assert _all_free(spec)


def test_a_proposer_fault_falls_back_to_plain_decoding(plain_pair, monkeypatch):
    base, spec = plain_pair
    speculator = spec.engine.speculator
    calls = {"n": 0}
    real = speculator.proposer.propose

    def flaky(tokens, k):
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise RuntimeError("injected proposer fault")
        return real(tokens, k)

    monkeypatch.setattr(speculator.proposer, "propose", flaky)
    errors = speculator.counters.num_proposer_errors
    assert _tokens(spec) == _tokens(base)
    assert speculator.counters.num_proposer_errors > errors
    assert spec.engine.stats().spec_decode_proposer_errors_total == speculator.counters.num_proposer_errors


def test_seeded_sampling_with_speculation_is_reproducible(plain_pair):
    _, spec = plain_pair
    p = SamplingParams(max_tokens=30, temperature=0.7, top_k=8, seed=1234, ignore_eos=True)
    alone = _tokens(spec, [PROMPTS[0]], p)
    crowd = spec.generate(PROMPTS, [p, *[SamplingParams(max_tokens=30, temperature=1.0)] * 3])
    assert crowd[0].outputs[0].token_ids == alone[0]


def test_seeded_sampling_draws_what_plain_decoding_draws(plain_pair):
    """One random number per emitted token, through the sampler's own draw: the same seed gives
    the same tokens with speculation as without."""
    base, spec = plain_pair
    before = _accepted(spec)
    params = [SamplingParams(max_tokens=30, temperature=0.7, top_k=8, seed=seed, ignore_eos=True) for seed in range(8)]
    prompts = PROMPTS * 2
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == \
           [o.outputs[0].token_ids for o in base.generate(prompts, params)]
    assert _accepted(spec) > before


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at p = 0.001 (Wilson-Hilferty; within 1% from df = 3 on)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _two_sample_chi2(a: list[int], b: list[int], min_expected: int = 5) -> tuple[float, int]:
    """Homogeneity of two equal-size samples of tokens; rare tokens pooled into one category."""
    counts: dict[int, list[int]] = {}
    for sample, col in ((a, 0), (b, 1)):
        for t in sample:
            counts.setdefault(t, [0, 0])[col] += 1
    rows = [c for c in counts.values() if sum(c) >= 2 * min_expected]
    pooled = [sum(c[0] for c in counts.values() if sum(c) < 2 * min_expected),
              sum(c[1] for c in counts.values() if sum(c) < 2 * min_expected)]
    if sum(pooled) >= 2 * min_expected:
        rows.append(pooled)
    stat = sum((x - y) ** 2 / (x + y) for x, y in rows)
    return stat, len(rows) - 1


@pytest.mark.slow
def test_seeded_sampling_keeps_the_target_distribution(llama_dir):
    """2,000 seeded samples with speculation against 2,000 without: at output positions 1, 2 and 3
    (those verified with proposals; position 0 comes from the prefill), a chi-square test finds
    no difference. (An accept-every-draft rule scores ~10x the critical value here.) Run with the
    n-gram proposer: the suffix proposer's guesses are deterministic too (a one-hot q), and go
    through the same verification."""
    base, spec = _engines(llama_dir, max_num_seqs=256)
    # The prompt holds the model's own greedy continuation, so the proposals after a sampled token
    # are likely under the target distribution: many are accepted, many rejected.
    seed_text = "Once upon a time there was"
    cont = base.generate(seed_text, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0]
    prompt = cont.prompt_token_ids + cont.outputs[0].token_ids
    n = 2000

    def sample(llm, offset):
        params = [SamplingParams(max_tokens=5, temperature=0.6, top_k=6, seed=offset + i, ignore_eos=True)
                  for i in range(n)]
        return [o.outputs[0].token_ids for o in llm.generate([prompt] * n, params)]

    # Other seeds for the second sample: with the same ones it would draw the very same tokens.
    without, with_spec = sample(base, 0), sample(spec, 10**6)
    assert _accepted(spec) > 200, spec.engine.speculator.counters  # 438 of 3,140 when written
    for position in (1, 2, 3):
        stat, df = _two_sample_chi2([t[position] for t in without], [t[position] for t in with_spec])
        assert df >= 3 and stat < _chi2_critical(df), (position, stat, df)


@METHODS
def test_a_predicted_output_is_proposed_and_never_changes_the_output(spec_config, llama_dir):
    """OpenAI's predicted outputs: the prediction is what the speculator proposes from, so a right
    one is accepted nearly whole, an edited one after it realigns, and the output is plain decoding's.
    (The random model's text does not survive tokenizing again, so these give the ids admission
    would make of a prediction's text; test_admission_tokenizes_a_prediction checks that part.)"""
    base, spec = _engines(llama_dir, spec_config, enable_prefix_caching=False)
    prompt = "Rewrite: the quick brown fox"
    plain = base.generate([prompt], GREEDY)[0].outputs[0].token_ids
    edited = plain[:12] + [7, 8, 9] + plain[15:]
    # each step emits its accepted proposals and one token of its own: 4 of 5 at most with ngram here
    for prediction, least in ((plain, len(plain) * 2 // 3), (edited, len(plain) // 2), ([5] * 30, 0)):
        before = spec.engine.speculator.counters.num_accepted_tokens
        params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
        params.prediction_token_ids = list(prediction)
        assert spec.generate([prompt], params)[0].outputs[0].token_ids == plain
        accepted = spec.engine.speculator.counters.num_accepted_tokens - before
        assert accepted >= least, (prediction, accepted)
    assert _all_free(spec)


def test_admission_tokenizes_a_prediction(llama_dir):
    from kvserve.backend.engine.admission import admit

    base, _ = _engines(llama_dir)
    params = SamplingParams(max_tokens=4, prediction="the cat sat on the mat")
    admit("a prompt", params, base.engine.limits, base.get_tokenizer().encode)
    expected = base.get_tokenizer().encode("the cat sat on the mat", add_special_tokens=False)
    assert params.prediction_token_ids.tolist() == expected
    with pytest.raises(ValueError, match="prediction"):
        SamplingParams(prediction="x" * (1 << 16 + 1))
