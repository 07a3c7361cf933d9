"""`kvserve serve` with no --model serves the real default (SmolLM2-135M-Instruct, fetched into the
cache), and the official openai client gets real text from it: the answers, stop strings the model
really produces, seeded sampling, long streamed answers and multi-byte characters."""
from __future__ import annotations

import json
import urllib.request

import pytest

from tests.serve_process import kvserve_serve

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(real_model_path: str):
    # real_model_path: fetched first, so the server's own fetch is a cache hit inside its start-up time.
    with kvserve_serve(["--port", "0", "--max-num-seqs", "16", "--log-format", "console"], timeout_s=300) as (_, line):
        assert f"model={MODEL}" in line, line
        yield openai.OpenAI(base_url=f"{line.split()[3]}/v1", api_key="unused", max_retries=0, timeout=120)


def _tokenize(client, text: str | None = None, messages: list | None = None) -> list[int]:
    root = str(client.base_url).removesuffix("/").removesuffix("/v1")
    body = {"model": MODEL, "prompt": text} if messages is None else {"model": MODEL, "messages": messages}
    req = urllib.request.Request(f"{root}/tokenize", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["tokens"]


def _chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


def test_default_model_is_listed_and_answers_paris(client) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    out = _chat(client, FRANCE, temperature=0, max_tokens=32)
    assert "Paris" in out.choices[0].message.content
    assert out.choices[0].finish_reason == "stop"  # the model's own end token, not the length limit


def test_a_stop_string_the_model_produces_cuts_the_text_there(client) -> None:
    full = _chat(client, FRANCE, temperature=0, max_tokens=32).choices[0].message.content
    cut = _chat(client, FRANCE, temperature=0, max_tokens=32, stop=["Paris"]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == full[:full.index("Paris")]
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       _chat(client, FRANCE, temperature=0, max_tokens=32, stop=["Paris"], stream=True))
    assert streamed == cut.message.content


def test_n2_with_a_seed_gives_two_different_real_sentences_again_and_again(client) -> None:
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    first = _chat(client, messages, n=2, temperature=1.0, seed=1234, max_tokens=40)
    again = _chat(client, messages, n=2, temperature=1.0, seed=1234, max_tokens=40)
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in again.choices]  # seeded: reproducible
    assert texts[0] != texts[1] and all(len(t.split()) >= 4 for t in texts)


def test_streamed_equals_non_streamed_on_a_long_answer(client) -> None:
    messages = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
    kw = dict(temperature=0, max_tokens=200, extra_body={"ignore_eos": True})
    whole = _chat(client, messages, **kw)
    assert whole.usage.completion_tokens == 200
    parts = [c.choices[0].delta.content or "" for c in _chat(client, messages, stream=True, **kw) if c.choices]
    assert "".join(parts) == whole.choices[0].message.content


def test_multi_byte_output_has_no_replacement_characters(client) -> None:
    messages = [{"role": "user", "content": "Write the French words for 'summer', 'Christmas' and 'coffee'."}]
    whole = _chat(client, messages, temperature=0, max_tokens=48).choices[0].message.content
    assert any(ord(ch) > 127 for ch in whole), whole  # accented letters came out
    assert "\ufffd" not in whole
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       _chat(client, messages, temperature=0, max_tokens=48, stream=True) if c.choices)
    assert streamed == whole


def test_echo_with_logprobs_scores_the_prompt_as_the_model_scored_its_own_tokens(client) -> None:
    """What an evaluation harness (lm-eval's loglikelihood) does: send context + continuation with
    echo, logprobs and one new token, and read the continuation's logprobs from the echoed prompt.
    Each must be the logprob the model gave that token when it generated it."""
    prompt = "The capital of France is"
    made = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=2,
                                     extra_body={"ignore_eos": True}).choices[0]
    ids, generated = _tokenize(client, prompt), _tokenize(client, prompt + made.text)
    scored = client.completions.create(model=MODEL, prompt=generated, max_tokens=1, temperature=0, logprobs=2,
                                       echo=True).choices[0]
    lp = scored.logprobs
    assert len(lp.tokens) == len(generated) + 1 == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert scored.text.startswith(prompt + made.text)
    assert "".join(lp.tokens[:len(generated)]) == prompt + made.text
    assert generated[:len(ids)] == ids  # the text tokenizes back into the tokens the model made
    assert lp.token_logprobs[len(ids):len(generated)] == pytest.approx(
        made.logprobs.token_logprobs[:len(generated) - len(ids)], abs=2e-3)
    for top, token in zip(lp.top_logprobs[len(ids):len(generated)], lp.tokens[len(ids):]):
        # greedy made these: each is its place's best, listed with at most one more (logprobs=2 lists 2)
        assert max(top, key=top.get) == token and len(top) == 2
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # Streamed, the echo heads the first chunk with the prompt's logprobs, and the whole agrees.
    chunks = list(client.completions.create(model=MODEL, prompt=generated, max_tokens=1, temperature=0,
                                            logprobs=2, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == scored.text
    streamed = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-4)
    # max_tokens 0 (the legacy API's way to score a text): the prompt alone, scored, nothing generated.
    for stream in (False, True):
        got = client.completions.create(model=MODEL, prompt=generated, max_tokens=0, logprobs=2, echo=True,
                                        stream=stream, **({"stream_options": {"include_usage": True}} if stream
                                                          else {}))
        parts = list(got) if stream else [got]
        text = "".join(c.choices[0].text for c in parts if c.choices)
        values = [v for c in parts if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
        assert text == prompt + made.text and values[0] is None
        assert values[1:] == pytest.approx(lp.token_logprobs[1:len(generated)], abs=1e-4)
        assert [c.choices[0].finish_reason for c in parts if c.choices][-1] == "length"
        assert parts[-1].usage.completion_tokens == 0 and parts[-1].usage.prompt_tokens == len(generated)


def test_prompt_logprobs_as_vllm_lists_them(client) -> None:
    """vLLM's extension: per prompt token, null first, then {id: {logprob, rank, decoded_token}}
    holding the token and the top k; the same numbers echo gives."""
    prompt = "The capital of France is"
    ids = _tokenize(client, prompt)
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0,
                                    extra_body={"prompt_logprobs": 2})
    listed = out.choices[0].model_extra["prompt_logprobs"]
    assert len(listed) == len(ids) and listed[0] is None
    echo = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0, logprobs=2,
                                     echo=True).choices[0].logprobs
    for place, token, echoed in zip(listed[1:], ids[1:], echo.token_logprobs[1:]):
        own = place[str(token)]
        assert own["logprob"] == pytest.approx(echoed, abs=1e-4) and own["rank"] >= 1
        assert sorted(v["rank"] for v in place.values()) == ([1, 2] if own["rank"] <= 2 else [1, 2, own["rank"]])
        best = min(place.values(), key=lambda v: v["rank"])
        assert best["logprob"] == max(v["logprob"] for v in place.values())
    rest = "".join(place[str(t)]["decoded_token"] for place, t in zip(listed[1:], ids[1:]))
    assert rest and prompt.endswith(rest)  # every token after the first, as text
    chat = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=1,
                                          extra_body={"prompt_logprobs": 0})
    listed = chat.model_extra["prompt_logprobs"]
    assert len(listed) == len(_tokenize(client, messages=FRANCE)) and listed[0] is None
    assert all(len(place) == 1 and next(iter(place.values()))["rank"] >= 1 for place in listed[1:])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=1, stream=True,
                                       extra_body={"prompt_logprobs": 1})
    assert info.value.body["param"] == "prompt_logprobs"


def test_bad_words_allowed_token_ids_and_prompt_truncation(client) -> None:
    """vLLM's sampling extensions on the real model: a banned word never comes, only allowed ids
    come, and a truncated prompt is read from its end (usage counts what was read)."""
    free = _chat(client, FRANCE, temperature=0, max_tokens=32).choices[0].message.content
    assert "Paris" in free
    banned = _chat(client, FRANCE, temperature=0, max_tokens=32, extra_body={"bad_words": ["Paris"]})
    assert "Paris" not in banned.choices[0].message.content
    yes_no = _tokenize(client, " yes") + _tokenize(client, " no")
    out = client.completions.create(model=MODEL, prompt="Is Paris in France? Answer:", max_tokens=3, temperature=0,
                                    extra_body={"allowed_token_ids": yes_no})
    assert set(out.choices[0].text.split()) <= {"yes", "no"} and out.usage.completion_tokens == 3
    long_prompt = "Some words that do not matter. " * 40 + "The capital of France is"
    cut = client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=8, temperature=0,
                                    extra_body={"truncate_prompt_tokens": 6})
    tail = client.completions.create(model=MODEL, prompt=_tokenize(client, long_prompt)[-6:], max_tokens=8,
                                     temperature=0)
    assert cut.usage.prompt_tokens == 6 and cut.choices[0].text == tail.choices[0].text


def test_return_token_ids_are_the_ids_the_engine_read_and_wrote(client) -> None:
    prompt = "The capital of France is"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                    extra_body={"return_token_ids": True}).model_dump()
    choice = out["choices"][0]
    assert choice["prompt_token_ids"] == _tokenize(client, prompt)
    assert len(choice["prompt_token_ids"]) == out["usage"]["prompt_tokens"]  # as the engine counted them
    assert len(choice["token_ids"]) == out["usage"]["completion_tokens"]
    cut = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                    extra_body={"return_token_ids": True, "truncate_prompt_tokens": 3}).model_dump()
    assert cut["choices"][0]["prompt_token_ids"] == _tokenize(client, prompt)[-3:] and cut["usage"]["prompt_tokens"] == 3
    chat = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=12, temperature=0,
                                          extra_body={"return_token_ids": True}).model_dump()
    assert chat["prompt_token_ids"] == _tokenize(client, messages=FRANCE)
    assert len(chat["choices"][0]["token_ids"]) == chat["usage"]["completion_tokens"]


def test_beam_search_on_the_real_model(client) -> None:
    """vLLM's use_beam_search on SmolLM2's chat: the best beam answers, beams come best first and
    differ, and one that ended with the end of the turn says stop without the end token."""
    out = _chat(client, FRANCE, n=2, max_tokens=12, extra_body={"use_beam_search": True, "logprobs": True}).model_dump()
    first, second = out["choices"]
    assert "Paris" in first["message"]["content"] and first["message"]["content"] != second["message"]["content"]
    assert [first["index"], second["index"]] == [0, 1]
    assert all(c["finish_reason"] in ("stop", "length") and c["logprobs"]["content"] for c in out["choices"])
    assert "<|im_end|>" not in first["message"]["content"]
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model=MODEL, messages=FRANCE, max_tokens=12, stream=True, extra_body={"use_beam_search": True})
        if chunk.choices and chunk.choices[0].index == 0)
    assert streamed == _chat(client, FRANCE, max_tokens=12, extra_body={"use_beam_search": True}).choices[0].message.content
