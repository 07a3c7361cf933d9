"""prompt_logprobs: each prompt token's logprob given the tokens before it equals transformers',
whatever chunks the prompt is cut into, with the prefix cache holding the prompt, with n > 1 and
after a preemption; and a request that asks for them changes nothing else."""
from __future__ import annotations

import random

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from tests.parity.hf_reference import _hf_model

PROMPT_LEN, TOP = 45, 3


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    rng = random.Random(11)
    return [rng.randrange(3, 500) for _ in range(PROMPT_LEN)]


@pytest.fixture(scope="module")
def reference(llama_dir, prompt) -> torch.Tensor:
    """transformers' logprobs [PROMPT_LEN - 1, vocab]: row i scores prompt token i + 1."""
    with torch.inference_mode():
        logits = _hf_model(llama_dir)(torch.tensor([prompt])).logits[0, :-1].float()
    return logits.log_softmax(dim=-1)


def _check(scored, prompt: list[int], reference: torch.Tensor) -> None:
    assert scored is not None and len(scored) == len(prompt) and scored[0] is None
    for i, entry in enumerate(scored[1:]):
        assert entry.token_id == prompt[i + 1]
        assert entry.logprob == pytest.approx(float(reference[i, prompt[i + 1]]), abs=1e-4)
        values, ids = reference[i].topk(TOP)
        assert [t for t, _ in entry.top] == ids.tolist()
        assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=1e-4)


@pytest.mark.parametrize("chunk", [16, 512])
def test_prompt_logprobs_match_transformers_in_chunks(llama_dir, prompt, reference, chunk):
    llm = LLM(model=llama_dir, max_model_len=128, max_num_batched_tokens=chunk, max_num_seqs=4,
              enable_prefix_caching=True)
    plain = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    scored = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, prompt_logprobs=TOP)
    first, again, base = llm.generate([prompt, prompt, prompt], [scored, scored, plain])
    _check(first.prompt_logprobs, prompt, reference)
    # The second finds the prompt cached, and must still score every position.
    _check(again.prompt_logprobs, prompt, reference)
    assert base.prompt_logprobs is None
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == base.outputs[0].token_ids
    kv = llm.engine.kv
    assert kv.num_free_blocks == kv.num_usable_blocks


def test_prompt_logprobs_with_n_and_zero_top(llama_dir, prompt, reference):
    llm = LLM(model=llama_dir, max_model_len=128, max_num_batched_tokens=20)
    out = llm.generate(prompt, SamplingParams(n=3, max_tokens=3, temperature=1.0, seed=3, prompt_logprobs=0))[0]
    assert len(out.outputs) == 3 and all(len(c.token_ids) == 3 for c in out.outputs)
    assert len(out.prompt_logprobs) == PROMPT_LEN and all(e.top == [] for e in out.prompt_logprobs[1:])
    for i, entry in enumerate(out.prompt_logprobs[1:]):
        assert entry.logprob == pytest.approx(float(reference[i, prompt[i + 1]]), abs=1e-4)


def test_one_token_prompt_has_only_the_leading_none(llama_dir):
    llm = LLM(model=llama_dir, max_model_len=64)
    out = llm.generate([[7]], SamplingParams(max_tokens=2, prompt_logprobs=2))[0]
    assert out.prompt_logprobs == [None]


def test_prompt_logprobs_survive_a_preemption(llama_dir, prompt, reference):
    """Few KV blocks: the scoring request is preempted while it decodes, and recomputed. Its prompt
    logprobs are reported once, complete, and the output is the one it gives alone."""
    alone = LLM(model=llama_dir, max_model_len=128)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, prompt_logprobs=1)
    expected = alone.generate(prompt, params)[0]
    tight = LLM(model=llama_dir, max_model_len=128, block_size=8, num_kv_blocks=1 + 16, max_num_batched_tokens=16)
    others = [[5 + i] * 30 for i in range(2)]
    # Last in: the newest running request is the one preempted.
    *_, out = tight.generate([*others, prompt], [SamplingParams(max_tokens=40, ignore_eos=True)] * 2 + [params])
    assert out.metrics.preemptions
    assert out.outputs[0].token_ids == expected.outputs[0].token_ids
    assert [(e.token_id, e.top[0][0]) for e in out.prompt_logprobs[1:]] == [
        (e.token_id, e.top[0][0]) for e in expected.prompt_logprobs[1:]]
    for i, entry in enumerate(out.prompt_logprobs[1:]):
        assert entry.logprob == pytest.approx(float(reference[i, prompt[i + 1]]), abs=1e-4)


def test_prompt_logprobs_out_of_range_is_refused():
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=True)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_prompt_logprobs_with_speculative_decoding(llama_dir, prompt, reference, method):
    """Verification steps and the draft's own passes leave the prompt rows alone."""
    spec = {"method": method, "num_speculative_tokens": 3}
    spec.update({"model": llama_dir, "load_policy": "off"} if method == "draft_model" else
                {"prompt_lookup_min": 1, "prompt_lookup_max": 3, "load_policy": "off"})
    llm = LLM(model=llama_dir, max_model_len=128, max_num_batched_tokens=16, speculative_config=spec)
    plain = LLM(model=llama_dir, max_model_len=128)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, prompt_logprobs=TOP)
    out = llm.generate([prompt, prompt[:20]], params)
    _check(out[0].prompt_logprobs, prompt, reference)
    assert [o.outputs[0].token_ids for o in out] == [
        o.outputs[0].token_ids for o in plain.generate([prompt, prompt[:20]], params)]
