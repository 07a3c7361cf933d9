"""Speculation for requests whose sampling carries per-position state: logprobs, repetition /
presence / frequency penalties, logit_bias, allowed_token_ids, bad_words, min_tokens and n > 1. Each verified position is
sampled as plain decoding would sample it after the accepted drafts before it, so the tokens
equal plain decoding's and so do the logprobs (within 1e-5: the forward scores a multi-token
query, whose rounding differs a little from a one-token one).

Every case asserts that proposals were verified and some accepted for it, so none passes with
speculation idle. The load policy is off here: what is tested is the verification."""
from __future__ import annotations

import pytest

from kvserve.backend import LLM, SamplingParams

PROMPTS = [
    "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat",
    "Once upon a time there was a dog. Once upon a time there was a dog. Once upon a",
    "def add(a, b): return a + b\ndef add(a, b): return a + b\ndef add(",
    "one two three four five one two three four five one two three",
]
CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
              "load_policy": "off"},
    "suffix": {"method": "suffix", "num_speculative_tokens": 8, "load_policy": "off"},
}
CASES = {
    "logprobs": dict(temperature=0, ignore_eos=True, logprobs=3),
    # Mild penalties: strong ones stop the output copying anything, and nothing would be accepted.
    "repetition": dict(temperature=0, ignore_eos=True, repetition_penalty=1.05),
    "presence_frequency": dict(temperature=0, ignore_eos=True, presence_penalty=0.2, frequency_penalty=0.1),
    "logit_bias": dict(temperature=0, ignore_eos=True, logit_bias={5: 3.0, 17: -2.0}),
    "min_tokens": dict(temperature=0, min_tokens=20),
    "sampled_penalties_logprobs": dict(temperature=0.5, top_k=5, seed=7, ignore_eos=True,
                                       repetition_penalty=1.05, logprobs=2),
    "n2_sampled": dict(temperature=0.5, top_k=5, seed=3, n=2, ignore_eos=True, frequency_penalty=0.05),
    "n3_greedy_logprobs": dict(temperature=0, n=3, ignore_eos=True, logprobs=1),
    "allowed_token_ids": dict(temperature=0, ignore_eos=True, allowed_token_ids=list(range(0, 512, 2))),
    "bad_words": dict(temperature=0, ignore_eos=True, bad_words=["the", "a", "one"]),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(llama_dir, request):
    base = LLM(model=llama_dir, max_model_len=256, max_num_seqs=8, enable_prefix_caching=False)
    spec = LLM(model=llama_dir, max_model_len=256, max_num_seqs=8, enable_prefix_caching=False,
               speculative_config=CONFIGS[request.param])
    return base, spec


def _assert_same(want, got):
    assert len(want) == len(got)
    for w_out, g_out in zip(want, got):
        for w, g in zip(w_out.outputs, g_out.outputs, strict=True):
            assert g.token_ids == w.token_ids and g.text == w.text and g.finish_reason == w.finish_reason
            if w.logprobs is None:
                assert g.logprobs is None
                continue
            assert len(g.logprobs) == len(w.logprobs) == len(w.token_ids)
            for lw, lg in zip(w.logprobs, g.logprobs):
                assert lg.token_id == lw.token_id and abs(lg.logprob - lw.logprob) < 1e-5
                assert [t for t, _ in lg.top] == [t for t, _ in lw.top]
                assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(lg.top, lw.top))


@pytest.mark.parametrize("case", sorted(CASES))
def test_stateful_requests_speculate_and_equal_plain_decoding(pair, case):
    base, spec = pair
    counters = spec.engine.speculator.counters
    drafts, accepted = counters.num_drafts, counters.num_accepted_tokens
    params = SamplingParams(max_tokens=32, **CASES[case])
    _assert_same(base.generate(PROMPTS, params), spec.generate(PROMPTS, params))
    assert counters.num_drafts > drafts and counters.num_accepted_tokens > accepted
    kv = spec.engine.kv
    assert kv.num_free_blocks == kv.num_usable_blocks and not spec.engine.groups


@pytest.mark.parametrize("case", ["repetition", "presence_frequency", "logit_bias", "allowed_token_ids", "bad_words"])
def test_the_state_changes_the_output(pair, case):
    """The cases above are not vacuous: their state changes what plain greedy decoding emits,
    so verification that ignored it (or the drafts accepted before a position) would differ."""
    base, _ = pair
    plain = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    stateful = SamplingParams(max_tokens=32, **CASES[case])
    assert [o.outputs[0].token_ids for o in base.generate(PROMPTS, plain)] != \
           [o.outputs[0].token_ids for o in base.generate(PROMPTS, stateful)]
