"""LLMEngine behaviour on the tiny model: stops, n > 1, seeds, aborts, validation, no leaked blocks."""
from __future__ import annotations

import pytest

from kvserve.backend import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(model=llama_dir, max_num_seqs=16, max_model_len=256)


def _all_free(llm) -> bool:
    kv = llm.engine.kv
    return kv.num_free_blocks == kv.num_usable_blocks and not llm.engine.groups


def test_stop_string_cuts_text_and_stop_token_ends(llm):
    base = llm.generate("Once upon a time", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))[0]
    text = base.outputs[0].text
    stop = text[5:9]
    assert stop and stop not in text[:5]
    out = llm.generate("Once upon a time", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True,
                                                          stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop and out.text == text[:text.index(stop)]
    tok = base.outputs[0].token_ids[3]
    out = llm.generate("Once upon a time", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True,
                                                          stop_token_ids=[tok]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == tok
    assert out.token_ids == base.outputs[0].token_ids[:base.outputs[0].token_ids.index(tok) + 1]
    assert _all_free(llm)


def test_n_completions_share_prompt_blocks_and_differ(llm):
    prompt = list(range(3, 3 + 40))
    eng = llm.engine
    eng.add_request("n3", prompt, SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=5))
    eng.step()
    tables = [eng.kv.block_ids(f"n3#{i}") for i in range(3)]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]  # two full prompt blocks shared
    while eng.has_unfinished():
        eng.step()
    outs = llm.generate(prompt, SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=5))[0].outputs
    assert len(outs) == 3 and len({tuple(o.token_ids) for o in outs}) > 1
    assert _all_free(llm)


def test_seeded_sampling_is_reproducible_alone_or_in_a_batch(llm):
    p = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=1234)
    alone = llm.generate("Hello", p)[0].outputs[0].token_ids
    crowd = llm.generate(["Hello", "Other prompt", "Yet another"],
                         [p, SamplingParams(max_tokens=12, temperature=1.0), SamplingParams(max_tokens=5)])
    assert crowd[0].outputs[0].token_ids == alone


def test_abort_frees_blocks_mid_generation(llm):
    eng = llm.engine
    eng.add_request("a1", "Once upon a time", SamplingParams(max_tokens=100, ignore_eos=True))
    eng.add_request("a2", list(range(5, 90)), SamplingParams(max_tokens=100, ignore_eos=True))
    for _ in range(3):
        eng.step()
    assert eng.kv.num_free_blocks < eng.kv.num_usable_blocks
    out = eng.abort("a1")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    eng.abort("a2")
    assert _all_free(llm)
    assert eng.abort("a1") is None  # aborting twice is harmless


@pytest.mark.parametrize("prompt, params, field", [
    ("", SamplingParams(), "prompt"),
    ([[]], SamplingParams(), "prompt"),  # one empty token-id prompt
    ([1, 2, 10**6], SamplingParams(), "prompt"),
    ([1, -2], SamplingParams(), "prompt"),
    (list(range(3, 300)), SamplingParams(), "context_length_exceeded"),
    ("hi", SamplingParams(max_tokens=1000), "context_length_exceeded"),
    ("hi", SamplingParams(top_k=10**6), "top_k"),
    ("hi", SamplingParams(stop_token_ids=[10**6]), "stop_token_ids"),
])
def test_bad_input_raises_value_error_naming_the_field_and_engine_keeps_serving(llm, prompt, params, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        llm.generate(prompt, params)
    assert llm.generate("still fine", SamplingParams(max_tokens=3))[0].outputs[0].token_ids
    assert _all_free(llm)


def test_a_stop_string_before_min_tokens_neither_stops_nor_cuts_the_text(llm):
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    base = llm.generate("Once upon a time", greedy)[0].outputs[0]
    stop = base.text[:3]  # in the first tokens' text
    assert stop.strip()
    params = SamplingParams(max_tokens=12, min_tokens=12, temperature=0, ignore_eos=True, stop=[stop])
    out = llm.generate("Once upon a time", params)[0].outputs[0]
    assert out.finish_reason == "length" and out.text == base.text and out.token_ids == base.token_ids
    assert _all_free(llm)


def test_prompt_tokens_are_counted_once_a_request_is_prefilled(llm):
    engine = llm.engine
    before = engine.prompt_tokens_total
    params = SamplingParams(max_tokens=2, temperature=0.8, seed=1, n=3)
    engine.add_request("counted", [5, 6, 7, 8, 9], params)
    engine.add_request("dropped", [5, 6, 7, 8, 9, 10, 11], SamplingParams(max_tokens=2))
    engine.abort("dropped")  # left before it was ever scheduled: never prefilled
    while engine.has_unfinished():
        engine.step()
    assert engine.prompt_tokens_total - before == 5  # once for the n=3 request, as its usage says
    assert _all_free(llm)


def test_min_tokens_max_tokens_and_logprobs(llm):
    out = llm.generate("Hi", SamplingParams(max_tokens=7, min_tokens=7, temperature=0, logprobs=3))[0].outputs[0]
    assert len(out.token_ids) == 7 and out.finish_reason == "length"
    assert len(out.logprobs) == 7 and all(len(lp.top) == 3 for lp in out.logprobs)
    assert all(lp.token_id == t and lp.logprob <= 0 for lp, t in zip(out.logprobs, out.token_ids))
    assert out.logprobs[0].top[0][0] == out.token_ids[0]  # greedy: the sampled token is the best one


def test_never_exceeds_max_model_len(llama_dir):
    small = LLM(model=llama_dir, max_model_len=40)
    out = small.generate(list(range(3, 33)), SamplingParams(max_tokens=None, ignore_eos=True))[0]
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 40
    assert out.outputs[0].finish_reason == "length"


def test_truncate_prompt_tokens_keeps_the_prompts_end(llm):
    prompt = list(range(3, 303))  # longer than max_model_len (256)
    greedy = dict(max_tokens=8, temperature=0, ignore_eos=True)
    cut = llm.generate(prompt, SamplingParams(truncate_prompt_tokens=40, **greedy))[0]
    tail = llm.generate(prompt[-40:], SamplingParams(**greedy))[0]
    assert cut.prompt_token_ids == prompt[-40:] and cut.outputs[0].token_ids == tail.outputs[0].token_ids
    fit = llm.generate(prompt, SamplingParams(truncate_prompt_tokens=-1, **greedy))[0]  # as many as fit
    assert fit.prompt_token_ids == prompt[-(256 - 8):]
    text = llm.generate("Once upon a time there was a small dog", SamplingParams(truncate_prompt_tokens=3, **greedy))[0]
    assert len(text.prompt_token_ids) == 3
    with pytest.raises(ValueError, match="^truncate_prompt_tokens"):
        SamplingParams(truncate_prompt_tokens=0)
    assert _all_free(llm)


def test_allowed_token_ids_and_bad_words(llm):
    greedy = dict(max_tokens=12, temperature=0, ignore_eos=True)
    allowed = [11, 12, 13, 14]
    for params in (SamplingParams(allowed_token_ids=allowed, **greedy),
                   SamplingParams(allowed_token_ids=allowed, max_tokens=12, temperature=1.0, seed=3, ignore_eos=True)):
        assert set(llm.generate("Once upon a time", params)[0].outputs[0].token_ids) <= set(allowed)
    with pytest.raises(ValueError, match="^allowed_token_ids"):
        llm.generate("hi", SamplingParams(allowed_token_ids=[10**6]))
    # nothing allowed but the end of sequence, which min_tokens bans: the request ends with an error
    # naming the field, never with a token it did not allow
    eos = min(llm.engine.eos_token_ids)
    failed = llm.generate("hi", SamplingParams(allowed_token_ids=[eos], min_tokens=2, max_tokens=4))[0]
    assert failed.error is not None and failed.error.startswith("allowed_token_ids: the constraint allowed no token")
    base = llm.generate("Once upon a time", SamplingParams(**greedy))[0].outputs[0]
    tok = llm.get_tokenizer()
    word_id = next(t for t in base.token_ids if tok.decode([t]).strip().isalpha())  # " and", say
    params = SamplingParams(bad_words=[tok.decode([word_id]).strip()], **greedy)
    out = llm.generate("Once upon a time", params)[0].outputs[0]
    assert [word_id] in params.bad_words_token_ids  # tokenized at admission, with the space form
    for banned in params.bad_words_token_ids:
        k = len(banned)
        assert all(out.token_ids[i:i + k] != banned for i in range(len(out.token_ids) - k + 1))
    assert out.token_ids != base.token_ids
    assert _all_free(llm)


def test_priority_is_honoured_only_under_the_priority_policy(llm, llama_dir):
    with pytest.raises(ValueError, match="^priority: priority scheduling is not enabled"):
        llm.generate("hi", SamplingParams(priority=1))  # as vLLM: refused, never silently ignored
    assert llm.generate("hi", SamplingParams(max_tokens=2, priority=0))[0].outputs[0].token_ids
    by_priority = LLM(model=llama_dir, max_num_seqs=1, max_model_len=128, scheduling_policy="priority")
    eng = by_priority.engine
    for rid, prio in (("first-but-low", 5), ("second", 0), ("third-urgent", -2)):
        eng.add_request(rid, f"prompt {rid}", SamplingParams(max_tokens=3, priority=prio, ignore_eos=True))
    order = []
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                order.append(out.request_id)
    assert order == ["third-urgent", "second", "first-but-low"]  # one at a time, most urgent first
    # vLLM's offline form: one priority per prompt, beside the sampling parameters
    outs = by_priority.generate(["a", "b"], SamplingParams(max_tokens=2), priority=[3, -3])
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 2]
    with pytest.raises(ValueError, match="^priority"):
        by_priority.generate(["a", "b"], SamplingParams(max_tokens=2), priority=[1])
    with pytest.raises(ValueError, match="^scheduling_policy"):
        LLM(model=llama_dir, scheduling_policy="lifo")
