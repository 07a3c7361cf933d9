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
