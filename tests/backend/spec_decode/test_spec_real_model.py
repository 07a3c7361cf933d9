"""Speculative decoding on the default real model (SmolLM2-135M-Instruct, GGUF): greedy output
with n-gram or suffix proposals equals plain greedy decoding on prompts whose answer copies the
prompt, and the proposals are accepted (the case both methods exist for)."""
from __future__ import annotations

import pytest

from kvserve.backend import LLM, SamplingParams

PASSAGE = ("The quick brown fox jumps over the lazy dog. The library opens at nine in the morning "
           "and closes at six in the evening, except on Sundays, when it stays closed all day.")
PROMPTS = [
    f"Repeat the following text exactly.\nText: {PASSAGE}\nRepeated text: {PASSAGE[:40]}",
    f"Text: {PASSAGE}\nThe same text in capital letters is not needed; copy it as it is: ",
    "def area(width, height):\n    return width * height\n\n# The same function, renamed to rect_area:\n"
    "def rect_area(",
]


CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "suffix": {"method": "suffix", "num_speculative_tokens": 8},
}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_real_model_greedy_with_speculation_equals_without(real_model_path, method):
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    args = dict(max_model_len=512, max_num_seqs=4)
    want = [o.outputs[0].token_ids for o in LLM(model=real_model_path, **args).generate(PROMPTS, params)]
    spec = LLM(model=real_model_path, speculative_config=CONFIGS[method], **args)
    got = [o.outputs[0].token_ids for o in spec.generate(PROMPTS, params)]
    assert got == want
    counters = spec.engine.speculator.counters
    assert counters.num_accepted_tokens > 0, counters


# 16 prompts: half copy a passage (where proposals pay), half are open questions (where they rarely do).
_PASSAGES = [
    "Water boils at one hundred degrees Celsius at sea level, and at a lower temperature on a mountain.",
    "The train leaves the station at eight fifteen and reaches the city two hours later.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside the leaves.",
    "Our office is closed on public holidays; urgent requests go to the support desk by email.",
]
EXACTNESS_PROMPTS = (
    [f"Copy this sentence twice.\nSentence: {p}\nCopies: {p} " for p in _PASSAGES]
    + [f"Rewrite in the past tense: {p}\nRewritten:" for p in _PASSAGES]
    + ["What is the capital of France?", "Name three colours of the rainbow.", "Write a haiku about rain.",
       "Explain what a prime number is.", "List the days of the week.", "How do bees make honey?",
       "Give me a tip for learning to cook.", "Why is the sky blue?"]
)
_SETTINGS = {
    "plain": dict(enable_prefix_caching=False),
    # The first half of the prompts twice: the second copy of each hits the prefix cache.
    "prefix_hits": dict(enable_prefix_caching=True),
    "chunked_prefill": dict(enable_prefix_caching=False, max_num_batched_tokens=48),
    # 16 requests of ~30-60 prompt + 128 output tokens in 96 blocks of 16: they must preempt.
    "preemption": dict(enable_prefix_caching=False, num_kv_blocks=96),
}


@pytest.mark.slow
@pytest.mark.parametrize("setting", sorted(_SETTINGS))
def test_real_model_16_prompts_x_128_tokens_exact_for_each_method(real_model_path, setting):
    """The issue's exactness check: greedy outputs identical with and without speculation, for
    each method, on 16 prompts x 128 tokens, plainly and with prefix hits, chunked prefill and
    preemption; each run must have accepted proposals (and preempted, where that is the point)."""
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    prompts = EXACTNESS_PROMPTS if setting != "prefix_hits" else EXACTNESS_PROMPTS[:8] * 2
    args = dict(max_model_len=512, max_num_seqs=16, **_SETTINGS[setting])
    want = [o.outputs[0].token_ids for o in LLM(model=real_model_path, **args).generate(prompts, params)]
    for method, config in sorted(CONFIGS.items()):
        spec = LLM(model=real_model_path, speculative_config=config, **args)
        got = [o.outputs[0].token_ids for o in spec.generate(prompts, params)]
        first_diff = [next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), None) for g, w in zip(got, want)]
        assert got == want, (method, first_diff)
        engine = spec.engine
        assert engine.speculator.counters.num_accepted_tokens > 0, (method, engine.speculator.counters)
        if setting == "preemption":
            assert engine.scheduler.num_preemptions_total > 0
        if setting == "prefix_hits":
            assert engine.kv.prefix_hits > 0
        assert engine.kv.num_free_blocks == engine.kv.num_usable_blocks
