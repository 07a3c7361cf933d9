"""POST /v1/responses (and GET / DELETE by id) against the in-memory backend, through the official
openai client: the Response object, the typed event stream in order (its text equal to the whole
answer), instructions, the stored chain of previous_response_id kept per API key, and bad input
with OpenAI's error shape."""
from __future__ import annotations

import json

import openai
import pytest

from gw_fakes import WORDS, GatewayServer, FakeBackend, delete, get, post
from kvserve.frontend.http.gateway_config import GatewayConfig
from kvserve.frontend.openai.responses_api.response_store import ResponseStore


def words(start: int, count: int) -> str:
    return " ".join(WORDS[(start + k) % len(WORDS)] for k in range(count))


def _prompt(server) -> str:
    return server.tokenizer.decode(server.backend.requests[-1].prompt, skip_special_tokens=False)


def test_create_answers_a_response_with_usage(client: openai.OpenAI) -> None:
    out = client.responses.create(model="tiny", input="hello world", max_output_tokens=4)
    assert out.object == "response" and out.id.startswith("resp_") and out.model == "tiny"
    assert out.output_text == words(0, 4)
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 4 and out.usage.total_tokens == out.usage.input_tokens + 4
    done = client.responses.create(model="tiny", input="hello", max_output_tokens=9, extra_body={"stop": ["gamma"]})
    assert done.status == "completed" and done.output_text == "alpha beta "
    assert done.output[0].type == "message" and done.output[0].content[0].type == "output_text"


def test_a_null_field_is_echoed_as_its_default(server) -> None:
    # The SDK's Response types parallel_tool_calls as a bool and tool_choice as a choice: an
    # explicit null in the request means the default, as a field left out does.
    reply = post(f"{server.url}/v1/responses", {"model": "tiny", "input": "x", "max_output_tokens": 1,
                                                "parallel_tool_calls": None, "tool_choice": None})
    assert reply.status == 200, reply.text
    assert reply.json()["parallel_tool_calls"] is True and reply.json()["tool_choice"] == "auto"


def test_instructions_and_input_items_render_as_chat(client: openai.OpenAI, server) -> None:
    client.responses.create(model="tiny", instructions="be brief", max_output_tokens=2, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "22 C"}])
    prompt = _prompt(server)
    assert prompt.startswith("<s><|im_start|>system\nbe brief")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n22 C\n</tool_response>" in prompt
    assert server.backend.requests[-1].sampling["max_tokens"] == 2


def test_stream_sends_typed_events_in_order_and_the_same_text(client: openai.OpenAI) -> None:
    whole = client.responses.create(model="tiny", input="hi", max_output_tokens=9, extra_body={"stop": ["zeta"]})
    with client.responses.stream(model="tiny", input="hi", max_output_tokens=9, extra_body={"stop": ["zeta"]}) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    deltas = kinds.count("response.output_text.delta")
    assert kinds == (["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added"] + ["response.output_text.delta"] * deltas
                     + ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                        "response.completed"]) and deltas > 0
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens


def test_output_text_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    kw = dict(model="tiny", input="hi", max_output_tokens=3, include=["message.output_text.logprobs"], top_logprobs=2)
    whole = client.responses.create(**kw)
    logprobs = whole.output[0].content[0].logprobs
    assert len(logprobs) == 3 and all(len(lp.top_logprobs) == 2 for lp in logprobs)  # one per output token
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                          logprobs=True, top_logprobs=2)
    assert [lp.model_dump() for lp in logprobs] == [lp.model_dump() for lp in chat.choices[0].logprobs.content]
    with client.responses.stream(**kw) as stream:
        events = list(stream)
    final = events[-1].response  # response.incomplete: max_output_tokens ended it
    streamed = [lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert streamed == [lp.token for lp in done.logprobs] == [lp.token for lp in logprobs]
    assert [lp.token for lp in final.output[0].content[0].logprobs] == streamed
    plain = client.responses.create(model="tiny", input="hi", max_output_tokens=2)
    assert plain.output[0].content[0].logprobs == []  # not asked for


def test_previous_response_id_continues_the_stored_conversation(client: openai.OpenAI, server) -> None:
    first = client.responses.create(model="tiny", input="first question", max_output_tokens=3)
    again = client.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    client.responses.create(model="tiny", input="second question", previous_response_id=first.id,
                            max_output_tokens=1)
    prompt = _prompt(server)
    assert prompt.index("first question") < prompt.index(first.output_text) < prompt.index("second question")
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="tiny", input="x", previous_response_id=first.id, max_output_tokens=1)
    assert info.value.body["code"] == "previous_response_not_found"


def test_store_false_keeps_nothing(client: openai.OpenAI) -> None:
    out = client.responses.create(model="tiny", input="x", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out.id)


@pytest.fixture(scope="module")
def two_keys(tokenizer_dir):
    config = GatewayConfig(served_model_names=["tiny"], api_keys={"sk-one": "default", "sk-two": "default"})
    with GatewayServer(FakeBackend(), config, tokenizer_dir) as srv:
        yield srv


@pytest.fixture(scope="module")
def short_context(tokenizer_dir):
    with GatewayServer(FakeBackend(), GatewayConfig(served_model_names=["tiny"], max_model_len=96), tokenizer_dir) as srv:
        yield srv


def test_truncation_auto_drops_the_oldest_items_until_the_input_fits(short_context) -> None:
    client = openai.OpenAI(base_url=f"{short_context.url}/v1", api_key="unused", max_retries=0, timeout=10)
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 6}
             for i in range(12)]
    kw = dict(model="tiny", instructions="be brief", input=turns, max_output_tokens=8)
    with pytest.raises(openai.BadRequestError) as info:  # disabled, the default: too long is a 400
        client.responses.create(**kw)
    assert info.value.body["code"] == "context_length_exceeded"
    out = client.responses.create(truncation="auto", **kw)
    assert out.truncation == "auto" and out.status == "incomplete"  # answered, up to max_output_tokens
    prompt = short_context.tokenizer.decode(short_context.backend.requests[-1].prompt, skip_special_tokens=False)
    assert len(short_context.backend.requests[-1].prompt) + 8 <= 96
    assert "be brief" in prompt and "turn 11" in prompt and "turn 0 " not in prompt  # the oldest went
    kept = [i for i in range(12) if f"turn {i} " in prompt]
    assert kept == list(range(kept[0], 12))  # a suffix of the conversation: only the oldest were dropped
    short = client.responses.create(truncation="auto", model="tiny", input="hi", max_output_tokens=2)
    assert "hi" in short_context.tokenizer.decode(short_context.backend.requests[-1].prompt) and short.output_text


@pytest.fixture(scope="module")
def tool_context(tokenizer_dir):  # room for a group or two of the conversation below
    with GatewayServer(FakeBackend(), GatewayConfig(served_model_names=["tiny"], max_model_len=420), tokenizer_dir) as srv:
        yield srv


def test_truncation_auto_never_keeps_a_tool_result_without_its_call(tool_context) -> None:
    server = tool_context
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=10)
    items: list[dict] = []
    for i in range(4):
        items += [{"role": "user", "content": f"ask {i}"},
                  {"type": "function_call", "call_id": f"c{i}", "name": f"fn{i}", "arguments": '{"q": 1}'},
                  {"type": "function_call_output", "call_id": f"c{i}", "output": f"result {i} " + "word " * 5}]
    items.append({"role": "user", "content": "last"})
    seen_cuts = set()
    for budget in range(2, 400, 13):  # each budget moves the cut: some would fall between a call and its result
        client.responses.create(model="tiny", input=items, max_output_tokens=budget, truncation="auto")
        prompt = server.tokenizer.decode(server.backend.requests[-1].prompt, skip_special_tokens=False)
        kept = [i for i in range(4) if f"result {i} " in prompt]
        for i in kept:
            assert f"fn{i}" in prompt, (budget, prompt)
        seen_cuts.add(tuple(kept))
    assert len(seen_cuts) > 1  # the budgets did move the cut


def test_another_keys_response_is_not_found_even_in_the_same_tenant(two_keys) -> None:
    one = openai.OpenAI(base_url=f"{two_keys.url}/v1", api_key="sk-one", max_retries=0, timeout=10)
    two = openai.OpenAI(base_url=f"{two_keys.url}/v1", api_key="sk-two", max_retries=0, timeout=10)
    mine = one.responses.create(model="tiny", input="secret", max_output_tokens=2)
    assert one.responses.retrieve(mine.id).output_text == mine.output_text
    for attempt in (lambda: two.responses.retrieve(mine.id), lambda: two.responses.delete(mine.id),
                    lambda: two.responses.create(model="tiny", input="x", previous_response_id=mine.id)):
        with pytest.raises(openai.NotFoundError) as info:
            attempt()
        assert mine.output_text not in str(info.value.body)
    assert one.responses.retrieve(mine.id).id == mine.id  # the other key's delete did nothing


@pytest.mark.parametrize("body, status, param", [
    ({"model": "tiny"}, 400, "input"),
    ({"input": []}, 400, "input"),
    ({"input": [{"type": "hologram"}]}, 400, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400, "input"),
    # JSON values a set or dict lookup cannot hash (a list or an object where a string belongs)
    ({"input": [{"role": ["user"], "content": "x"}]}, 400, "input"),
    ({"input": [{"role": "user", "content": [{"type": {"a": 1}, "text": "x"}]}]}, 400, "input"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": ["input_text"]}]}]}, 400, "input"),
    ({"input": "x", "background": True}, 400, "background"),
    ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools"),
    ({"input": "x", "tools": [{"type": "function", "name": "f", "strict": "yes"}]}, 400, "tools"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}}, 400, "text.format"),
    ({"input": "x", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, 400, "include"),
    ({"input": "x", "include": "message.output_text.logprobs"}, 400, "include"),
    ({"input": "x", "top_logprobs": 21}, 400, "top_logprobs"),
    ({"input": "x", "model": "gpt-9"}, 404, "model"),
])
def test_bad_input_gets_the_status_and_openai_error_shape(server, body, status, param) -> None:
    reply = post(f"{server.url}/v1/responses", body)
    assert reply.status == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param


def test_unknown_ids_are_404_on_get_and_delete(server) -> None:
    assert get(f"{server.url}/v1/responses/resp_nope").status == 404
    assert delete(f"{server.url}/v1/responses/resp_nope").status == 404


def test_the_store_is_a_bounded_lru_per_owner() -> None:
    store = ResponseStore(max_entries=2, max_bytes=10_000)
    for i in range(3):
        store.put("k", {"id": f"r{i}"}, [])
    assert store.get("k", "r0") is None and store.get("k", "r1") is not None and len(store) == 2
    store.put("k", {"id": "r3"}, [])  # r1 was used last: r2 goes
    assert store.get("k", "r2") is None and store.get("k", "r1") is not None
    assert store.get("other", "r1") is None and not store.delete("other", "r1")
    small = ResponseStore(max_entries=10, max_bytes=100)
    small.put("k", {"id": "big", "text": "x" * 200}, [])
    assert small.get("k", "big") is None  # larger than the store: not kept
    assert not ResponseStore(max_entries=0).enabled


def test_text_format_and_forced_tools_become_the_engine_constraint(client: openai.OpenAI, server) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    client.responses.create(model="tiny", input="x", max_output_tokens=1,
                            text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
    assert server.backend.requests[-1].sampling["structured_outputs"] == {"json": schema}
    client.responses.create(model="tiny", input="x", max_output_tokens=1, text={"format": {"type": "json_object"}})
    assert server.backend.requests[-1].sampling["structured_outputs"] == {"json_object": True}
    tool = {"type": "function", "name": "get_city", "parameters": schema}
    client.responses.create(model="tiny", input="x", max_output_tokens=1, tools=[tool],
                            tool_choice={"type": "function", "name": "get_city"})
    tag = server.backend.requests[-1].sampling["structured_outputs"]["structural_tag"]["format"]
    assert tag["begin"].endswith('"get_city", "arguments": ') and tag["content"]["json_schema"] == schema
    with pytest.raises(openai.BadRequestError) as info:  # one constraint per request, named by its field
        client.responses.create(model="tiny", input="x", max_output_tokens=1, tools=[tool],
                                tool_choice={"type": "function", "name": "get_city"},
                                text={"format": {"type": "json_object"}})
    assert info.value.body["param"] == "tool_choice"


def test_a_failure_mid_stream_is_an_error_event_then_a_failed_response_with_an_sdk_code(server) -> None:
    from typing import get_args

    from openai.types.responses.response_error import ResponseError
    reply = post(f"{server.url}/v1/responses", {"model": "tiny", "input": "CRASH", "max_output_tokens": 9,
                                                "stream": True})
    assert reply.status == 200
    events = [json.loads(line[len("data: "):]) for line in reply.text.split("\n") if line.startswith("data: ")]
    error, failed = events[-2:]
    assert error["type"] == "error" and error["code"] == "internal_error"  # the gateway's own code
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] in get_args(ResponseError.model_fields["code"].annotation)
    assert failed["response"]["error"]["code"] == "server_error"
    assert failed["response"]["error"]["type"] == "internal_server_error"
    assert "exploded" not in reply.text  # no engine internals
    assert failed["response"]["output"][0]["content"][0]["text"] == "alpha beta"  # what it had said
