"""Structured outputs and tool calling end to end: the official openai client (and tritonclient,
straight to the Triton model) against `kvserve serve` on the default real model.

One server for the module; requests of a test run concurrently (one batch) with short
max_tokens. KVSERVE_E2E_MODEL serves another model instead of the default.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import time

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("xgrammar")

from kvserve.loadtests.studies.structured_schemas import SCHEMAS  # noqa: E402
from tests.reliability.served import start_served  # noqa: E402

API_KEY = "sk-structured"
CHECKER = jsonschema.FormatChecker()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
                   "required": ["tz"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def served():
    model = os.environ.get("KVSERVE_E2E_MODEL")
    args = ([] if model is None else ["--model", model]) + [
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-num-seqs", "48"]
    server = start_served(args, api_key=API_KEY, timeout=900)
    try:
        yield server
    finally:
        server.stop(timeout=60)


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _parallel(fn, items):
    with cf.ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


def _prompt(name: str) -> list[dict]:
    return [{"role": "user", "content": f"Give me one example '{name.replace('_', ' ')}' record as JSON."}]


def _fmt(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def _valid(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema, format_checker=CHECKER)


@pytest.mark.slow
def test_twenty_schemas_validate_unstreamed_and_with_n_2(client, model):
    def one(name):
        r = client.chat.completions.create(model=model, messages=_prompt(name), response_format=_fmt(name),
                                           max_tokens=120, temperature=0.7, seed=11, n=2)
        return name, r
    for name, r in _parallel(one, list(SCHEMAS)):
        assert len(r.choices) == 2
        for choice in r.choices:
            assert choice.finish_reason == "stop", (name, choice.message.content)
            _valid(choice.message.content, SCHEMAS[name])


@pytest.mark.slow
def test_twenty_schemas_validate_streamed(client, model):
    def one(name):
        stream = client.chat.completions.create(model=model, messages=_prompt(name), response_format=_fmt(name),
                                                max_tokens=120, temperature=0, stream=True)
        text, finish = [], None
        for chunk in stream:
            for c in chunk.choices:
                text.append(c.delta.content or "")
                finish = c.finish_reason or finish
        return name, "".join(text), finish
    for name, text, finish in _parallel(one, list(SCHEMAS)):
        assert finish == "stop", (name, text)
        _valid(text, SCHEMAS[name])


def test_parse_with_a_pydantic_model(client, model):
    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        country: str = pydantic.Field(max_length=20)
        population_millions: int = pydantic.Field(ge=0, le=50)

    r = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Describe Paris."}],
                                      response_format=City, max_tokens=120, temperature=0)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, City) and 0 <= parsed.population_millions <= 50


def test_regex_choice_and_json_object_on_chat_and_completions(client, model):
    regex = r"[A-Z]{2}-[0-9]{4}"
    r = client.completions.create(model=model, prompt="A licence plate:", max_tokens=20, temperature=0.5,
                                  extra_body={"structured_outputs": {"regex": regex}})
    assert re.fullmatch(regex, r.choices[0].text), r.choices[0].text
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Is the sky blue?"}],
                                       max_tokens=10, extra_body={"guided_choice": ["yes", "no", "maybe"]})
    assert r.choices[0].message.content in ("yes", "no", "maybe")
    r = client.completions.create(model=model, prompt="Weekday:", max_tokens=10, n=2, temperature=1.0,
                                  extra_body={"structured_outputs": {"choice": ["Monday", "Friday"]}})
    assert {c.text for c in r.choices} <= {"Monday", "Friday"}
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": 'Answer with the JSON object {"ok": true}'}],
        max_tokens=200, temperature=0, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.completions.create(model=model, prompt="Answer:", max_tokens=10,
                                  extra_body={"guided_grammar": 'root ::= "ok" | "fine" [0-9]'})
    assert re.fullmatch(r"ok|fine[0-9]", r.choices[0].text)


def _joined_stream(client, model, content: list | None = None, **kw):
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(model=model, stream=True, **kw):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            if content is not None and c.delta.content:
                content.append(c.delta.content)
            for d in c.delta.tool_calls or []:
                slot = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    assert slot["id"] is None, "a call's id comes once"
                    slot["id"], slot["name"] = d.id, d.function.name
                slot["arguments"] += (d.function.arguments or "") if d.function else ""
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_forced_tool_calls_validate_and_stream_the_same(client, model, choice):
    kw = dict(messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=80, temperature=0)
    streamed_content: list[str] = []
    whole, streamed = _parallel(lambda stream: _joined_stream(client, model, streamed_content, **kw) if stream
                                else client.chat.completions.create(model=model, **kw), [False, True])
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    # calls only: the newline the constraint puts between calls is not content, streamed or not
    assert msg.content is None and streamed_content == [], (msg.content, streamed_content)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in msg.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        if isinstance(choice, dict):
            assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    calls, finish = streamed
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.function.name, c.function.arguments)
                                                            for c in msg.tool_calls]
    assert all(c["id"] and c["id"].startswith("call_") for c in calls)


def test_auto_tool_choice_streams_content_and_calls_as_the_whole_response(client, model):
    # The model decides; whatever it writes, the stream must carry the same content and calls.
    kw = dict(messages=[{"role": "system", "content": "Use the tools when they help."}] + ASK, tools=TOOLS,
              tool_choice="auto", max_tokens=60, temperature=0)
    content: list[str] = []
    whole, (calls, finish) = _parallel(lambda stream: _joined_stream(client, model, content, **kw) if stream
                                       else client.chat.completions.create(model=model, **kw), [False, True])
    msg = whole.choices[0].message
    assert "".join(content) == (msg.content or "")
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.function.name, c.function.arguments)
                                                            for c in msg.tool_calls or []]
    assert finish == whole.choices[0].finish_reason
    assert (finish == "tool_calls") == bool(calls) or finish == "length"


def test_parallel_tool_calls_false_gives_one_call(client, model):
    r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=80, temperature=0)
    assert len(r.choices[0].message.tool_calls) == 1


def test_full_tool_round_trip(client, model):
    first = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=80, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    final = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="auto",
                                           max_tokens=40, temperature=0)
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    none = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="none",
                                          max_tokens=20, temperature=0)
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content


def test_auto_tool_choice_needs_the_server_flags_and_tools_refuse_bad_shapes(client, model):
    for bad, param in [({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
                       ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                        "tool_choice"),
                       ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
                        "tool_choice"),
                       ({"functions": [{"name": "f"}]}, "functions")]:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=model, messages=ASK, max_tokens=5, **bad)
        assert err.value.status_code == 400 and err.value.body["param"] == param, (bad, err.value.body)


@pytest.mark.parametrize("extra, param", [
    ({"guided_json": "{not json"}, "guided_json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "not": {"required": ["a"]}}}}}, "response_format"),
    ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
    ({"guided_grammar": "root ::= missing"}, "guided_grammar"),
    ({"guided_json": {"type": "object", "description": "x" * 70_000}}, "guided_json"),
    ({"structured_outputs": {"json": {"type": "object"}, "regex": "a"}}, "structured_outputs"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"response_format": {"type": "xml"}}, "response_format"),
], ids=["not-json", "not-a-schema", "unsupported-keyword", "bad-regex", "bad-grammar", "oversized",
        "two-kinds", "two-fields", "unknown-format"])
def test_bad_constraints_are_400_error_objects(served, extra, param):
    for path, body in (("/v1/chat/completions", {"messages": ASK}), ("/v1/completions", {"prompt": "Hi"})):
        if path == "/v1/completions" and "response_format" in extra:
            continue
        for stream in (False, True):
            reply = served.post(path, {"max_tokens": 5, "stream": stream, **body, **extra},
                                headers={"Authorization": f"Bearer {API_KEY}"})
            assert reply.status == 400, (path, stream, reply.body[:300])
            error = reply.json()["error"]
            assert error["param"] == param and error["type"] == "invalid_request_error", error
            assert ".cc" not in error["message"] and "x" * 100 not in error["message"]


def test_cancelled_constrained_stream_frees_blocks_and_matcher(served, client, model):
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "A long JSON list of many cities with details."}],
        response_format={"type": "json_object"}, max_tokens=2000, stream=True, temperature=1.0,
        extra_body={"ignore_eos": True})
    seen = 0
    for chunk in stream:
        seen += 1
        if seen == 8:
            assert served.metrics()["kvserve:num_grammar_matchers"] == 1  # live while it streams
            break
    stream.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and served.metrics()["kvserve:num_grammar_matchers"] != 0:
        time.sleep(0.1)
    assert served.metrics()["kvserve:num_grammar_matchers"] == 0
    assert served.wait_idle(30) == (0, 0, 0)


def test_tritonclient_straight_to_the_model(served):
    grpc = pytest.importorskip("tritonclient.grpc")
    import numpy as np
    schema = SCHEMAS["nested_address"]
    got: list = []
    done = __import__("threading").Event()

    def callback(result, error):
        got.append((result, error))
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    triton = grpc.InferenceServerClient(served.backend)
    try:
        def inputs(sampling: dict):
            text = grpc.InferInput("text_input", [1], "BYTES")
            text.set_data_from_numpy(np.array(["Give me a JSON address record:".encode()], dtype=object))
            params = grpc.InferInput("sampling_parameters", [1], "BYTES")
            params.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=object))
            stream = grpc.InferInput("stream", [1], "BOOL")
            stream.set_data_from_numpy(np.array([False]))
            return [text, params, stream]
        triton.start_stream(callback=callback)
        triton.async_stream_infer("llm", inputs({"max_tokens": 120, "temperature": 0,
                                                 "structured_outputs": {"json": schema}}),
                                  enable_empty_final_response=True)
        assert done.wait(120)
        texts = [r.as_numpy("text_output") for r, e in got if e is None and r.as_numpy("text_output") is not None]
        assert not [e for _, e in got if e is not None]
        _valid(b"".join(t[0] for t in texts).decode(), schema)
        got.clear()
        done.clear()
        triton.async_stream_infer("llm", inputs({"max_tokens": 5, "structured_outputs": {"regex": "[a-"}}),
                                  enable_empty_final_response=True)
        assert done.wait(60)
        errors = [e for _, e in got if e is not None]
        # The engine's error as it crosses the seam: kind and field in a parseable header.
        assert errors and "[kvserve kind=invalid param=structured_outputs] structured_outputs:" in str(errors[0])
    finally:
        triton.stop_stream()
        triton.close()
