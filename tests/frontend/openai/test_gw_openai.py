"""The gateway against an in-memory backend, through the official openai client."""
from __future__ import annotations

import openai
import pytest

from gw_fakes import WORDS, get, post
from kvserve.frontend.http.cache_salt import effective_cache_salt


def words(start: int, count: int) -> str:
    return " ".join(WORDS[(start + k) % len(WORDS)] for k in range(count))


def test_completion_non_streaming(client: openai.OpenAI) -> None:
    out = client.completions.create(model="tiny", prompt="one two three", max_tokens=4)
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    assert out.model == "tiny"
    assert [c.text for c in out.choices] == [words(0, 4)]
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == 3 and out.usage.completion_tokens == 4 and out.usage.total_tokens == 7
    assert out.usage.prompt_tokens_details.cached_tokens == 1


def test_alias_and_default_model(client: openai.OpenAI, server) -> None:
    out = client.completions.create(model="tiny-alias", prompt="x", max_tokens=1)
    assert out.model == "tiny-alias"
    body = post(f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": 1}).json()
    assert body["model"] == "tiny"


def test_completion_n2_and_multiple_prompts_are_indexed_like_openai(client: openai.OpenAI, server) -> None:
    out = client.completions.create(model="tiny", prompt=["a b", "c d e"], n=2, max_tokens=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert [c.text for c in out.choices] == [words(0, 2), words(1, 2), words(0, 2), words(1, 2)]
    assert out.usage.prompt_tokens == 5  # each prompt once, not once per choice
    assert out.usage.completion_tokens == 8
    sent = server.backend.requests[-2:]
    assert {r.request_id[-2:] for r in sent} == {"-0", "-1"} and all(r.sampling["n"] == 2 for r in sent)


def test_token_id_prompts_go_as_input_ids(client: openai.OpenAI, server) -> None:
    client.completions.create(model="tiny", prompt=[[5, 6, 7], [8]], max_tokens=1)
    assert [r.prompt for r in server.backend.requests[-2:]] == [[5, 6, 7], [8]]


def test_sampling_fields_reach_the_engine_with_its_names(client: openai.OpenAI, server) -> None:
    client.completions.create(
        model="tiny", prompt="p", max_tokens=3, temperature=0.5, top_p=0.9, seed=7, stop="zzz",
        presence_penalty=0.1, frequency_penalty=0.2, logit_bias={"5": 1.5},
        extra_body={"top_k": 0, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True, "min_tokens": 1,
                    "stop_token_ids": [3], "cache_salt": "tenant-1"},
    )
    s = server.backend.requests[-1].sampling
    assert s == {"n": 1, "max_tokens": 3, "temperature": 0.5, "top_p": 0.9, "seed": 7, "stop": ["zzz"],
                 "presence_penalty": 0.1, "frequency_penalty": 0.2, "logit_bias": {"5": 1.5}, "top_k": -1,
                 "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True, "min_tokens": 1,
                 "stop_token_ids": [3],
                 "cache_salt": effective_cache_salt(server.config.cache_salt_secret, None, "tenant-1")}
    assert s["cache_salt"] != "tenant-1"  # the engine never sees a client's salt alone (tenant isolation)


def test_stop_string_truncates_and_reports_stop(client: openai.OpenAI) -> None:
    out = client.completions.create(model="tiny", prompt="p", max_tokens=10, stop=["gamma"])
    assert out.choices[0].text == "alpha beta "
    assert out.choices[0].finish_reason == "stop"


def test_completion_streaming_with_usage(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="tiny", prompt="a b", n=2, max_tokens=3, stream=True,
                                            stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    *content, usage = chunks
    assert usage.choices == [] and usage.usage.completion_tokens == 6 and usage.usage.prompt_tokens == 2
    assert all(c.usage is None for c in content)
    for idx in (0, 1):
        mine = [c.choices[0] for c in content if c.choices[0].index == idx]
        assert "".join(c.text for c in mine) == words(idx, 3)
        assert [c.finish_reason for c in mine] == [None, None, "length"]  # on the last content chunk


def test_echo_prepends_prompt(client: openai.OpenAI) -> None:
    out = client.completions.create(model="tiny", prompt="hello", max_tokens=1, echo=True)
    assert out.choices[0].text == "hello" + words(0, 1)
    streamed = list(client.completions.create(model="tiny", prompt="hello", max_tokens=1, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == "hello" + words(0, 1)


def test_completion_logprobs(client: openai.OpenAI, server) -> None:
    """The backend sends token ids and logprobs; the gateway renders each token's text."""
    text = server.tokenizer.token_text
    out = client.completions.create(model="tiny", prompt="p", max_tokens=3, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp.tokens == [text(100), text(101), text(102)] and all(lp.tokens)
    assert lp.token_logprobs == [-0.25] * 3
    offsets = [0, len(text(100)), len(text(100)) + len(text(101))]
    assert lp.text_offset == offsets
    assert lp.top_logprobs[0] == {text(200): -1.0, text(201): -2.0, text(100): -0.25}
    streamed = list(client.completions.create(model="tiny", prompt="p", max_tokens=3, logprobs=0, stream=True))
    assert [c.choices[0].logprobs.text_offset for c in streamed] == [[o] for o in offsets]


def test_chat_non_streaming(client: openai.OpenAI, server) -> None:
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]}],
        max_completion_tokens=3,
    )
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == words(0, 3)
    assert out.choices[0].finish_reason == "length"
    prompt = server.backend.requests[-1].prompt
    assert isinstance(prompt, list)  # rendered and tokenized by the gateway
    text = server.tokenizer.decode(prompt, skip_special_tokens=False)
    assert text == "<s><|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello\nworld<|im_end|>\n<|im_start|>assistant\n"
    assert out.usage.prompt_tokens == len(prompt)


def test_continue_final_message_and_template_kwargs_reach_the_prompt(client: openai.OpenAI, server) -> None:
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Sure: {"}]
    out = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2,
                                         extra_body={"continue_final_message": True,
                                                     "chat_template_kwargs": {"unused_by_this_template": 1}})
    assert out.choices[0].message.content == words(0, 2)  # only what follows the prefill
    text = server.tokenizer.decode(server.backend.requests[-1].prompt, skip_special_tokens=False)
    assert text == "<s><|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nSure: {"  # left open
    tokenized = post(f"{server.url}/tokenize", {"messages": msgs, "continue_final_message": True}).json()
    assert tokenized["tokens"] == server.backend.requests[-1].prompt
    refused = post(f"{server.url}/tokenize", {"messages": msgs, "continue_final_message": True,
                                               "add_generation_prompt": True})
    assert refused.status == 400 and refused.json()["error"]["param"] == "continue_final_message"


def test_chat_echo_heads_the_reply_with_the_final_assistant_message(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Sure: {"}]
    kw = dict(model="tiny", messages=msgs, max_tokens=2, extra_body={"continue_final_message": True, "echo": True})
    out = client.chat.completions.create(**kw)
    assert out.choices[0].message.content == "Sure: {" + words(0, 2)  # the whole message
    assert out.usage.completion_tokens == 2  # the echo is no generated token
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices]
    assert deltas[:2] == ["", "Sure: {"] and "".join(d or "" for d in deltas) == out.choices[0].message.content
    # the final message is the user's: nothing of the reply's own role to echo
    plain = client.chat.completions.create(model="tiny", messages=msgs[:1], max_tokens=2, extra_body={"echo": True})
    assert plain.choices[0].message.content == words(0, 2)


def test_add_special_tokens_as_vllm_reads_it(client: openai.OpenAI, server) -> None:
    client.completions.create(model="tiny", prompt="hello there", max_tokens=1, extra_body={"add_special_tokens": False})
    assert server.backend.requests[-1].prompt == server.tokenizer.encode("hello there", add_special_tokens=False)
    client.completions.create(model="tiny", prompt="hello there", max_tokens=1)
    assert server.backend.requests[-1].prompt == "hello there"  # the engine adds them, as vLLM's does
    msgs = [{"role": "user", "content": "hello"}]
    client.chat.completions.create(model="tiny", messages=msgs, max_tokens=1)
    plain = server.backend.requests[-1].prompt  # a chat's default: the template writes them, none added
    client.chat.completions.create(model="tiny", messages=msgs, max_tokens=1, extra_body={"add_special_tokens": True})
    added = server.backend.requests[-1].prompt
    text = server.tokenizer.decode(plain, skip_special_tokens=False)
    assert added == server.tokenizer.encode(text, add_special_tokens=True)  # what the tokenizer adds, if anything


def test_return_token_ids_lists_the_prompt_and_each_choice(client: openai.OpenAI, server) -> None:
    """vLLM's return_token_ids: whole and streamed, completions (per choice) and chat (prompt once)."""
    ids_of = lambda k, count: [100 + (k + j) % len(WORDS) for j in range(count)]  # noqa: E731 (FakeBackend's)
    extra = {"return_token_ids": True}
    out = client.completions.create(model="tiny", prompt=["hello there", "general kenobi"], max_tokens=3, n=2,
                                    extra_body=extra).model_dump()
    hello, kenobi = (server.tokenizer.encode(p, add_special_tokens=True) for p in ("hello there", "general kenobi"))
    assert [c["prompt_token_ids"] for c in out["choices"]] == [hello, hello, kenobi, kenobi]
    assert [c["token_ids"] for c in out["choices"]] == [ids_of(0, 3), ids_of(1, 3)] * 2
    ids = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=1, extra_body=extra).model_dump()
    assert ids["choices"][0]["prompt_token_ids"] == [5, 6, 7]
    chunks = [c.model_dump() for c in client.completions.create(model="tiny", prompt="hello there", max_tokens=3,
                                                               stream=True, extra_body=extra)]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == hello
    assert all("prompt_token_ids" not in c["choices"][0] or c is chunks[0] for c in chunks)
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == ids_of(0, 3)

    msgs = [{"role": "user", "content": "hello"}]
    chat = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, extra_body=extra).model_dump()
    assert chat["prompt_token_ids"] == server.backend.requests[-1].prompt
    assert chat["choices"][0]["token_ids"] == ids_of(0, 2)
    chunks = [c.model_dump() for c in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, n=2,
                                                                    stream=True, extra_body=extra)]
    assert chunks[0]["prompt_token_ids"] == server.backend.requests[-1].prompt
    assert sum("prompt_token_ids" in c for c in chunks) == 1  # once, in the first chunk
    for index in (0, 1):
        got = [t for c in chunks for ch in c["choices"] if ch["index"] == index for t in ch["token_ids"]]
        assert got == ids_of(index, 2)
    plain = client.completions.create(model="tiny", prompt="hello", max_tokens=1).model_dump()
    assert "token_ids" not in plain["choices"][0] or plain["choices"][0]["token_ids"] is None


def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(client: openai.OpenAI) -> None:
    extra = {"return_tokens_as_token_ids": True}
    out = client.completions.create(model="tiny", prompt="p", max_tokens=2, logprobs=1, extra_body=extra)
    lp = out.choices[0].logprobs
    assert lp.tokens == ["token_id:100", "token_id:101"]
    assert set(lp.top_logprobs[0]) == {"token_id:200", "token_id:100"}
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "p"}], max_tokens=1,
                                          logprobs=True, top_logprobs=1, extra_body=extra)
    entry = chat.choices[0].logprobs.content[0]
    assert entry.token == "token_id:100" and entry.top_logprobs[0].token == "token_id:200"


def test_chat_streaming_shapes(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=2, stream=True,
        stream_options={"include_usage": True},
    ))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    *content, usage = chunks
    assert usage.choices == [] and usage.usage.completion_tokens == 4
    for idx in (0, 1):
        mine = [c.choices[0] for c in content if c.choices[0].index == idx]
        assert mine[0].delta.role == "assistant" and mine[0].delta.content == ""
        assert "".join(c.delta.content or "" for c in mine[1:]) == words(idx, 2)
        assert [c.finish_reason for c in mine] == [None, None, "length"]


def test_chat_logprobs(client: openai.OpenAI, server) -> None:
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2, logprobs=True, top_logprobs=1)
    content = out.choices[0].logprobs.content
    text = server.tokenizer.token_text
    assert [c.token for c in content] == [text(100), text(101)]
    # the token's own bytes: token 100 of the tiny model is one byte of a character, shown as U+FFFD
    assert text(100) == "\ufffd" and content[0].bytes == list(server.tokenizer.token_bytes(100)) == [0xA3]
    assert content[0].logprob == -0.25
    assert [(t.token, t.logprob) for t in content[0].top_logprobs] == [(text(200), -1.0)]
    assert server.backend.requests[-1].sampling["logprobs"] == 1
    plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert plain.choices[0].logprobs is None and "logprobs" not in server.backend.requests[-1].sampling


def test_models_routes(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny", "tiny-alias"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_tokenize_detokenize_roundtrip(server) -> None:
    r = post(f"{server.url}/tokenize", {"prompt": "hello world", "return_token_strs": True})
    assert r.status == 200
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0 and len(body["token_strs"]) == body["count"]
    back = post(f"{server.url}/detokenize", {"tokens": body["tokens"]}).json()
    assert back == {"prompt": "hello world"}
    chat = post(f"{server.url}/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
    text = post(f"{server.url}/detokenize", {"tokens": chat["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n")


def test_health_version_metrics_openapi(server) -> None:
    assert get(f"{server.url}/health").status == 200
    server.backend.is_ready = False
    try:
        r = get(f"{server.url}/health")
        assert r.status == 503 and r.json()["error"]["type"] == "service_unavailable"
    finally:
        server.backend.is_ready = True
    assert get(f"{server.url}/version").json()["version"]
    metrics = get(f"{server.url}/metrics").text
    assert 'kvserve:http_requests_total{route="/health",status="200"}' in metrics
    assert "kvserve:http_streams_in_flight" in metrics
    assert "kvserve:num_requests_running 0.0" in metrics  # the backend's text follows the gateway's
    doc = get(f"{server.url}/openapi.json").json()
    assert doc["openapi"].startswith("3.") and "/v1/chat/completions" in doc["paths"]
    assert doc["components"]["schemas"]["CompletionRequest"]["properties"]["n"]["maximum"] == 16


def test_response_ids_take_the_clients_id_as_vllm_does_and_engine_ids_stay_unique(client, server) -> None:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert post(f"{server.url}/v1/chat/completions", {**chat, "request_id": "job-7"}).json()["id"] == "chatcmpl-job-7"
    both = post(f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": 1, "request_id": "body-id"},
                headers={"X-Request-Id": "header-id"})
    assert both.json()["id"] == "cmpl-header-id" and both.headers["x-request-id"] == "header-id"  # the header wins
    streamed = client.chat.completions.create(stream=True, extra_body={"request_id": "job-8"}, **chat)
    assert {chunk.id for chunk in streamed} == {"chatcmpl-job-8"}
    # one id sent twice (a retry, or two clients that agree on ids) is two requests to the engine
    for _ in range(2):
        post(f"{server.url}/v1/chat/completions", {**chat, "request_id": "job-7"})
    first, second = server.backend.requests[-2:]
    assert first.request_id != second.request_id and "job-7" not in first.request_id
    unsafe = post(f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": 1}, headers={"X-Request-Id": "a b"})
    assert unsafe.json()["id"].startswith("cmpl-") and "a b" not in unsafe.json()["id"]  # an unsafe one is not taken
    assert post(f"{server.url}/v1/completions", {"prompt": "x", "request_id": ""}).status == 400


def test_continuous_usage_stats_put_each_choices_usage_so_far_in_every_chunk(client) -> None:
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "one two three"}], max_tokens=3, n=2, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    *choice_chunks, last = chunks
    assert not last.choices and last.usage.completion_tokens == 6  # the whole, as ever
    prompt = last.usage.prompt_tokens
    so_far: dict[int, list[int]] = {}
    for chunk in choice_chunks:
        assert chunk.usage.prompt_tokens == prompt  # the opening chunks too: the prompt was counted first
        assert chunk.usage.total_tokens == prompt + chunk.usage.completion_tokens
        so_far.setdefault(chunk.choices[0].index, []).append(chunk.usage.completion_tokens)
    assert {i: counts[-1] for i, counts in so_far.items()} == {0: 3, 1: 3}
    assert all(counts == sorted(counts) and counts[0] == 0 for counts in so_far.values())
    plain = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True,
        stream_options={"include_usage": True}))
    assert all(chunk.usage is None for chunk in plain[:-1])  # without it, as OpenAI: only the last


def test_a_predicted_output_goes_to_the_engine_and_usage_compares_the_reply_to_it(client, server) -> None:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
    out = client.chat.completions.create(prediction={"type": "content", "content": "alpha beta gamma"}, **chat)
    assert server.backend.requests[-1].sampling["prediction"] == "alpha beta gamma"
    details = out.usage.completion_tokens_details
    # the fake's ids are not the tokenizer's: nothing of the prediction is in the reply's ids
    predicted = len(server.tokenizer.encode("alpha beta gamma", add_special_tokens=False))
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (0, predicted)
    text_parts = [{"type": "text", "text": "alpha "}, {"type": "text", "text": "beta"}]
    parts = client.chat.completions.create(prediction={"type": "content", "content": text_parts}, stream=True,
                                           stream_options={"include_usage": True}, **chat)
    assert list(parts)[-1].usage.completion_tokens_details.rejected_prediction_tokens > 0
    assert server.backend.requests[-1].sampling["prediction"] == "alpha beta"
    assert client.chat.completions.create(**chat).usage.completion_tokens_details is None  # no prediction, no details
    for bad in ({"type": "text", "content": "x"}, {"type": "content", "content": 5}, "x"):
        assert post(f"{server.url}/v1/chat/completions", {**chat, "prediction": bad}).json()["error"]["param"] == "prediction"
    both = post(f"{server.url}/v1/chat/completions", {**chat, "use_beam_search": True,
                                                     "prediction": {"type": "content", "content": "x"}})
    assert both.status == 400 and both.json()["error"]["param"] == "prediction"


def test_usage_counts_the_predicted_tokens_the_reply_kept_in_order() -> None:
    import asyncio

    from kvserve.frontend.openai.responses import ChoiceState, Usage, compare_prediction
    usage = Usage()
    choices = [ChoiceState(0, token_ids=[1, 2, 9, 3, 4]), ChoiceState(1, token_ids=[4, 3, 2, 1])]
    asyncio.run(compare_prediction(usage, [1, 2, 3, 4], choices))
    # the first kept 1 2 3 4 in order (9 was an insertion); the reversed second keeps one in order
    assert usage.prediction == {"accepted_prediction_tokens": 4 + 1, "rejected_prediction_tokens": 0 + 3}
    assert usage.body(choices)["completion_tokens_details"] == usage.prediction
