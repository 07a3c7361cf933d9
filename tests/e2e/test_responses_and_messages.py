"""OpenAI's Responses API and Anthropic's Messages API end to end: the official `openai` and
`anthropic` SDKs against `kvserve serve` on the real default model (SmolLM2-135M-Instruct), with
two API keys of one tenant. Plain answers, instructions, forced tools whose arguments validate,
text.format through responses.parse, a previous_response_id chain, both streams (event types in
order, text equal to the whole answer), stop sequences, a tool_result round trip, and bad input
with each API's status and error shape."""
from __future__ import annotations

import json
import urllib.request

import pytest

from tests.serve_process import kvserve_serve

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("xgrammar")
pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
KEY, OTHER_KEY = "sk-e2e-one", "sk-e2e-two"  # both of the tenant "default"
FRANCE = "What is the capital of France?"
WEATHER_SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
ASK_WEATHER = "What is the weather in Paris right now?"
GREEDY = {"temperature": 0}  # the anthropic SDK takes sampling fields only as extra_body


@pytest.fixture(scope="module")
def url(real_model_path: str):
    args = ["--port", "0", "--max-num-seqs", "16", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--api-key", KEY, "--api-key", OTHER_KEY, "--log-format", "console"]
    with kvserve_serve(args, timeout_s=300) as (_, line):
        assert f"model={MODEL}" in line, line
        yield line.split()[3]


@pytest.fixture(scope="module")
def oai(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(url: str):
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=120)


def _post(url: str, path: str, body: dict, headers: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


# ---- the Responses API ---------------------------------------------------------------------------
def test_responses_create_answers_paris(oai) -> None:
    out = oai.responses.create(model=MODEL, input=FRANCE, temperature=0, max_output_tokens=48)
    assert out.status == "completed" and "Paris" in out.output_text
    assert out.usage.output_tokens > 0 and out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens


def test_responses_instructions_are_the_system_message(url: str, oai) -> None:
    teacher = "You are a geography teacher. Answer in one short sentence."
    told = oai.responses.create(model=MODEL, input=FRANCE, temperature=0, max_output_tokens=8, instructions=teacher)
    assert told.instructions == teacher
    # The prompt is exactly the chat template's rendering of [system: instructions, user: input].
    _, counted = _post(url, "/tokenize", {"messages": [{"role": "system", "content": teacher},
                                                       {"role": "user", "content": FRANCE}]},
                       {"Authorization": f"Bearer {KEY}"})
    assert told.usage.input_tokens == counted["count"]


def test_responses_forced_function_call_validates_against_its_schema(oai) -> None:
    tool = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
            "parameters": WEATHER_SCHEMA}
    out = oai.responses.create(model=MODEL, input=ASK_WEATHER, tools=[tool], temperature=0, max_output_tokens=64,
                               tool_choice={"type": "function", "name": "get_weather"})
    calls = [item for item in out.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_SCHEMA)


def test_responses_stream_of_a_forced_function_call(oai) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}
    kw = dict(model=MODEL, input=ASK_WEATHER, tools=[tool], temperature=0, max_output_tokens=64,
              tool_choice={"type": "function", "name": "get_weather"})
    whole = [item for item in oai.responses.create(**kw).output if item.type == "function_call"]
    with oai.responses.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    # The tool parser gives arguments out up to the last "}" seen (tool_parser.py says why): a flat
    # object like these arguments comes in one fragment, a nested one in several.
    deltas = kinds.count("response.function_call_arguments.delta")
    assert deltas >= 1 and kinds == (
        ["response.created", "response.in_progress", "response.output_item.added"]
        + ["response.function_call_arguments.delta"] * deltas
        + ["response.function_call_arguments.done", "response.output_item.done", "response.completed"])
    calls = [item for item in final.output if item.type == "function_call"]
    assert [c.arguments for c in calls] == [c.arguments for c in whole]
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_SCHEMA)


class Capital(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)


def test_responses_parse_with_a_json_schema_text_format(oai) -> None:
    out = oai.responses.parse(model=MODEL, input=FRANCE + " Answer as JSON.", text_format=Capital, temperature=0,
                              max_output_tokens=64)
    assert isinstance(out.output_parsed, Capital) and out.output_parsed.city


def test_responses_output_text_logprobs_equal_the_chat_routes(oai) -> None:
    out = oai.responses.create(model=MODEL, input=FRANCE, max_output_tokens=12, temperature=0, top_logprobs=2,
                               include=["message.output_text.logprobs"])
    chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": FRANCE}], max_tokens=12,
                                       temperature=0, logprobs=True, top_logprobs=2)
    got = out.output[0].content[0].logprobs
    want = chat.choices[0].logprobs.content
    assert [lp.token for lp in got] == [lp.token for lp in want] and len(got) == out.usage.output_tokens
    assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(got, want))


def test_responses_two_turn_chain_with_previous_response_id(oai) -> None:
    first = oai.responses.create(model=MODEL, input="My name is Ada. Say hello to me.", temperature=0,
                                 max_output_tokens=24)
    second = oai.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                  temperature=0, max_output_tokens=24)
    assert second.previous_response_id == first.id
    # The second prompt holds the first turn and its answer.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert oai.responses.retrieve(second.id).output_text == second.output_text


def test_responses_stream_events_in_order_and_text_equal_to_unstreamed(oai) -> None:
    kw = dict(model=MODEL, input=FRANCE, temperature=0, max_output_tokens=48)
    whole = oai.responses.create(**kw)
    with oai.responses.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    deltas = kinds.count("response.output_text.delta")
    assert deltas > 1 and kinds == (
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
        + ["response.output_text.delta"] * deltas
        + ["response.output_text.done", "response.content_part.done", "response.output_item.done",
           "response.completed"])
    assert final.output_text == whole.output_text


def test_responses_bad_input_status_and_shape(url: str, oai) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    for body, status, param in [
        ({"model": MODEL}, 400, "input"),
        ({"model": MODEL, "input": [{"type": "computer_call_output", "call_id": "x"}]}, 400, "input"),
        ({"model": MODEL, "input": "hi", "background": True}, 400, "background"),
        ({"model": MODEL, "input": "hello " * 20000, "max_output_tokens": 4}, 400, "input"),
        ({"model": MODEL, "input": "hi", "previous_response_id": "resp_0123456789"}, 404, "previous_response_id"),
    ]:
        code, reply = _post(url, "/v1/responses", body, auth)
        assert code == status and set(reply["error"]) == {"message", "type", "param", "code"}, reply
        assert reply["error"]["param"] == param, reply
    mine = oai.responses.create(model=MODEL, input="hi", max_output_tokens=4)
    other = openai.OpenAI(base_url=oai.base_url, api_key=OTHER_KEY, max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model=MODEL, input="and?", previous_response_id=mine.id, max_output_tokens=4)


# ---- the Messages API ----------------------------------------------------------------------------
def test_messages_create_answers_paris(claude) -> None:
    out = claude.messages.create(model=MODEL, max_tokens=48, extra_body=GREEDY, messages=[{"role": "user", "content": FRANCE}])
    assert out.stop_reason == "end_turn" and "Paris" in out.content[0].text
    assert out.usage.input_tokens > 0 and out.usage.output_tokens > 0


def test_messages_stream_text_equals_create(claude) -> None:
    kw = dict(model=MODEL, max_tokens=48, extra_body=GREEDY, messages=[{"role": "user", "content": FRANCE}])
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_messages_stop_sequence_is_reported_and_cut(claude) -> None:
    kw = dict(model=MODEL, max_tokens=48, extra_body=GREEDY, messages=[{"role": "user", "content": FRANCE}])
    full = claude.messages.create(**kw).content[0].text
    cut = claude.messages.create(stop_sequences=["Paris"], **kw)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == "Paris"
    assert cut.content[0].text == full[:full.index("Paris")]
    with claude.messages.stream(stop_sequences=["Paris"], **kw) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == cut.content[0].text and final.stop_sequence == "Paris"


def test_messages_prefill_is_continued_as_chat_and_completions_continue_it(url: str, claude, oai) -> None:
    """Anthropic's prefill (a final assistant turn) and the chat route's continue_final_message both
    leave the turn open: the reply goes on from the prefill, as a completion of the open prompt does."""
    prefill = "The capital of France is"
    messages = [{"role": "user", "content": FRANCE}, {"role": "assistant", "content": prefill}]
    text = claude.messages.create(model=MODEL, max_tokens=16, extra_body=GREEDY, messages=messages).content[0].text
    assert "Paris" in text and prefill not in text  # it continues the sentence, it does not start over
    chat = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                       extra_body={"continue_final_message": True})
    assert chat.choices[0].message.content == text
    echoed = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                         extra_body={"continue_final_message": True, "echo": True})
    assert echoed.choices[0].message.content == prefill + text  # the whole message, as vLLM's echo gives it
    status, tokenized = _post(url, "/tokenize", {"model": MODEL, "messages": messages, "continue_final_message": True},
                              {"Authorization": f"Bearer {KEY}"})
    assert status == 200
    completion = oai.completions.create(model=MODEL, prompt=tokenized["tokens"], max_tokens=16, temperature=0)
    assert completion.choices[0].text == text


def _weather_tool() -> dict:
    return {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_SCHEMA}


def test_messages_forced_tool_validates_and_a_tool_result_round_trips(claude) -> None:
    ask = {"role": "user", "content": ASK_WEATHER}
    out = claude.messages.create(model=MODEL, max_tokens=64, extra_body=GREEDY, messages=[ask], tools=[_weather_tool()],
                                 tool_choice={"type": "tool", "name": "get_weather"})
    uses = [b for b in out.content if b.type == "tool_use"]
    assert out.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER_SCHEMA)
    with claude.messages.stream(model=MODEL, max_tokens=64, extra_body=GREEDY, messages=[ask], tools=[_weather_tool()],
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        streamed = stream.get_final_message()
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [uses[0].input]
    follow = claude.messages.create(model=MODEL, max_tokens=48, extra_body=GREEDY, tools=[_weather_tool()],
                                    tool_choice={"type": "none"}, messages=[
        ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in out.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "22 degrees and sunny"}]}])
    assert follow.content and follow.content[0].type == "text" and follow.content[0].text.strip()
    assert follow.stop_reason in ("end_turn", "max_tokens")


def test_messages_bad_input_status_and_anthropic_shape(url: str, claude) -> None:
    for body, headers, status, kind in [
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, {"x-api-key": KEY}, 400,
         "invalid_request_error"),
        ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
         {"x-api-key": KEY}, 400, "invalid_request_error"),
        ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hello " * 20000}]},
         {"x-api-key": KEY}, 400, "invalid_request_error"),
        ({"model": "claude-sonnet-4", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
         {"x-api-key": KEY}, 404, "not_found_error"),
        ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
         {"x-api-key": "sk-wrong"}, 401, "authentication_error"),
    ]:
        code, reply = _post(url, "/v1/messages", body, headers)
        assert code == status and reply["type"] == "error" and reply["error"]["type"] == kind, reply
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "system", "content": "no"}])
