"""POST /v1/messages against the in-memory backend, through Anthropic's own SDK: the Message
object, the typed event stream (its text equal to the whole answer), errors in Anthropic's shape,
x-api-key as well as Bearer, and a conversation with tool_use / tool_result blocks turned into
the chat prompt every route renders."""
from __future__ import annotations

import pytest

from gw_fakes import WORDS, post
from kvserve.frontend.openai.anthropic.messages_body import StopTail

anthropic = pytest.importorskip("anthropic")
API_KEY = "sk-test-key"  # tests/frontend/conftest.py's `secured` server
HELLO = [{"role": "user", "content": "hello world"}]


def words(start: int, count: int) -> str:
    return " ".join(WORDS[(start + k) % len(WORDS)] for k in range(count))


@pytest.fixture()
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=10)


def test_create_answers_a_message_with_usage(claude) -> None:
    out = claude.messages.create(model="tiny", max_tokens=4, messages=HELLO)
    assert out.type == "message" and out.role == "assistant" and out.id.startswith("msg_")
    assert out.model == "tiny"
    assert [b.type for b in out.content] == ["text"] and out.content[0].text == words(0, 4)
    assert out.stop_reason == "max_tokens" and out.stop_sequence is None
    assert out.usage.output_tokens == 4 and out.usage.input_tokens > 0


def test_stream_sends_the_event_sequence_and_the_same_text(claude) -> None:
    whole = claude.messages.create(model="tiny", max_tokens=6, messages=HELLO).content[0].text
    with claude.messages.stream(model="tiny", max_tokens=6, messages=HELLO) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    raw = [k for k in kinds if k not in ("text",)]  # the SDK adds its own "text" helper events
    assert raw[0] == "message_start" and raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == whole and final.stop_reason == "max_tokens" and final.usage.output_tokens == 6


def test_sampling_fields_reach_the_engine_in_chat_form(claude, server) -> None:
    # The current SDK has no temperature / top_p / top_k arguments: it sends them as extra_body.
    claude.messages.create(model="tiny", max_tokens=3, messages=HELLO, system="be brief", stop_sequences=["zeta"],
                           extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5})
    sampling = server.backend.requests[-1].sampling
    assert sampling["max_tokens"] == 3 and sampling["temperature"] == 0.5 and sampling["top_k"] == 5
    assert sampling["stop"] == ["zeta"] and sampling["include_stop_str_in_output"] is True
    prompt = server.tokenizer.decode(server.backend.requests[-1].prompt, skip_special_tokens=False)
    assert "<|im_start|>system\nbe brief" in prompt


def test_tool_use_and_tool_result_blocks_become_the_chat_conversation(claude, server) -> None:
    messages = [{"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                   "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                              "content": [{"type": "text", "text": "22 C"}]}]}]
    tools = [{"name": "get_weather", "description": "weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    out = claude.messages.create(model="tiny", max_tokens=2, messages=messages, tools=tools,
                                 tool_choice={"type": "none"})
    assert out.content[0].text == words(0, 2)
    prompt = server.tokenizer.decode(server.backend.requests[-1].prompt, skip_special_tokens=False)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n22 C\n</tool_response>" in prompt


def test_a_final_assistant_turn_is_a_prefill_the_model_continues(claude, server) -> None:
    messages = HELLO + [{"role": "assistant", "content": [{"type": "text", "text": "Here is the JSON: {"}]}]
    out = claude.messages.create(model="tiny", max_tokens=2, messages=messages)
    assert out.content[0].text == words(0, 2)  # only what follows the prefill, as Anthropic answers
    prompt = server.tokenizer.decode(server.backend.requests[-1].prompt, skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\nHere is the JSON: {")  # the turn left open
    with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
        claude.messages.create(model="tiny", max_tokens=2, messages=HELLO + [{"role": "assistant", "content": "Hi "}])
    # a final assistant turn that is only a tool call is no prefill: a new turn follows it
    tool_turn = HELLO + [{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f",
                                                            "input": {}}]}]
    claude.messages.create(model="tiny", max_tokens=2, messages=tool_turn)
    prompt = server.tokenizer.decode(server.backend.requests[-1].prompt, skip_special_tokens=False)
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("body, status, fragment", [
    ({"model": "tiny", "messages": HELLO}, 400, "max_tokens"),
    ({"model": "tiny", "max_tokens": 2}, 400, "messages"),
    ({"max_tokens": 2, "messages": HELLO}, 400, "model"),
    ({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]},
     400, "content block type"),
    ({"model": "tiny", "max_tokens": 2, "messages": [{"role": "system", "content": "x"}]}, 400, "role"),
    ({"model": "tiny", "max_tokens": 0, "messages": HELLO}, 400, "max_tokens"),
    ({"model": "tiny", "max_tokens": 2, "messages": HELLO, "thinking": {"type": "enabled", "budget_tokens": 9}},
     400, "thinking"),
    ({"model": "claude-opus", "max_tokens": 2, "messages": HELLO}, 404, "model"),
])
def test_bad_input_gets_the_status_and_anthropic_error_shape(server, body, status, fragment) -> None:
    reply = post(f"{server.url}/v1/messages", body)
    assert reply.status == status, reply.text
    error = reply.json()
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert error["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert fragment in error["error"]["message"]


def test_the_sdk_raises_its_own_errors(claude) -> None:
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-opus", max_tokens=2, messages=HELLO)
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "TOOLONG"}])
    assert info.value.body["error"]["type"] == "invalid_request_error"


def test_x_api_key_and_bearer_both_authenticate(secured) -> None:
    good = anthropic.Anthropic(base_url=secured.url, api_key=API_KEY, max_retries=0, timeout=10)
    assert good.messages.create(model="tiny", max_tokens=1, messages=HELLO).content[0].text == words(0, 1)
    with pytest.raises(anthropic.AuthenticationError) as info:
        anthropic.Anthropic(base_url=secured.url, api_key="sk-wrong", max_retries=0,
                            timeout=10).messages.create(model="tiny", max_tokens=1, messages=HELLO)
    assert info.value.body["error"]["type"] == "authentication_error"
    bearer = post(f"{secured.url}/v1/messages", {"model": "tiny", "max_tokens": 1, "messages": HELLO},
                  headers={"Authorization": f"Bearer {API_KEY}"})
    assert bearer.status == 200, bearer.text
    # And the OpenAI routes take x-api-key too (one key check for every route).
    chat = post(f"{secured.url}/v1/chat/completions", {"model": "tiny", "max_tokens": 1, "messages": HELLO},
                headers={"x-api-key": API_KEY})
    assert chat.status == 200, chat.text


def test_stop_tail_takes_a_stop_sequence_off_the_end_however_the_text_was_cut() -> None:
    text = "one two three STOP"
    for cut in range(1, len(text)):
        tail = StopTail(["STOP", "ST"])
        out = tail.feed(text[:cut]) + tail.feed(text[cut:])
        rest, stop = tail.finish(stopped=True)
        assert (out + rest, stop) == ("one two three ", "STOP")
    tail = StopTail(["STOP"])
    assert tail.feed("a S") == "a " and tail.flush() == "S"  # more output came: it was no stop sequence
    assert tail.finish(stopped=False) == ("", None)


def test_count_tokens_counts_the_prompt_messages_would_send(claude, server) -> None:
    counted = claude.messages.count_tokens(model="tiny", messages=HELLO, system="be brief")
    claude.messages.create(model="tiny", max_tokens=1, messages=HELLO, system="be brief")
    assert counted.input_tokens == len(server.backend.requests[-1].prompt)
    prefilled = HELLO + [{"role": "assistant", "content": "Sure"}]  # the turn left open, not closed
    counted = claude.messages.count_tokens(model="tiny", messages=prefilled)
    claude.messages.create(model="tiny", max_tokens=1, messages=prefilled)
    assert counted.input_tokens == len(server.backend.requests[-1].prompt)
    reply = post(f"{server.url}/v1/messages/count_tokens", {"model": "tiny"})
    assert reply.status == 400 and reply.json()["error"]["type"] == "invalid_request_error"
