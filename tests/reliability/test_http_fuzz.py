"""Byte-level fuzzing of every route's JSON body against the live server (hypothesis).

schemathesis (test_schema_fuzz.py) sends well-formed JSON shaped by the schema; this sends
what a schema cannot describe: other encodings, raw surrogate and invalid UTF-8 bytes, NUL
bytes, escaped lone surrogates, integers of thousands of digits, deep nesting, huge arrays,
truncated and spliced bodies, each field given any JSON value. For every reply:
- no 5xx, and no stream event carrying a server error;
- an error body is an OpenAI error object (Anthropic's on /v1/messages) of at most 4 KiB;
- no error body holds any of the request's string values (8 characters or more) or of
  the raw bytes spliced into it.
"""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.served import Served

ROUTES = {
    "/v1/completions": ("model", "prompt", "max_tokens", "n", "stream", "stream_options", "temperature", "top_p",
                        "top_k", "min_p", "seed", "stop", "stop_token_ids", "logit_bias", "logprobs", "echo",
                        "best_of", "suffix", "presence_penalty", "frequency_penalty", "repetition_penalty",
                        "min_tokens", "ignore_eos", "timeout", "cache_salt", "user", "skip_special_tokens",
                        "include_stop_str_in_output", "guided_json", "guided_regex", "guided_choice",
                        "guided_grammar", "structured_outputs", "response_format", "prompt_logprobs",
                        "allowed_token_ids", "bad_words", "truncate_prompt_tokens", "return_token_ids",
                        "return_tokens_as_token_ids", "add_special_tokens", "priority", "logits_processors"),
    "/v1/chat/completions": ("model", "messages", "max_tokens", "max_completion_tokens", "n", "stream", "tools",
                             "tool_choice", "response_format", "logprobs", "top_logprobs", "temperature", "seed",
                             "stop", "add_generation_prompt", "chat_template_kwargs", "echo", "user", "timeout",
                             "continue_final_message", "logit_bias", "stream_options", "structured_outputs",
                             "guided_json", "guided_regex", "documents", "chat_template", "return_token_ids",
                             "bad_words"),
    "/v1/responses": ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream",
                      "store", "background", "previous_response_id", "tools", "tool_choice", "text", "metadata",
                      "parallel_tool_calls", "reasoning", "truncation", "include", "user"),
    "/v1/messages": ("model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature",
                     "top_p", "top_k", "tools", "tool_choice", "thinking", "metadata"),
    "/v1/messages/count_tokens": ("model", "messages", "system", "tools", "tool_choice", "max_tokens"),
    "/tokenize": ("model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"),
    "/detokenize": ("model", "tokens"),
}
MAX_ERROR_BODY = 4096
MIN_ECHO = 8  # shorter strings may occur in any message by chance ("model", "prompt")
ROLES = ["user", "system", "assistant", "tool", "developer", "x"]
ANTHROPIC_ROUTES = {"/v1/messages", "/v1/messages/count_tokens"}  # errors in Anthropic's shape: {"type": "error", "error": {"type", "message"}}
# What messages may name: fields, roles, constraint kinds and schema keywords.
VOCABULARY = {name for names in ROUTES.values() for name in names} | set(ROLES) | {
    "json_schema", "json_object", "structural_tag", "properties", "required", "minimum",
    "input_text", "output_text", "function_call", "function_call_output", "tool_use", "tool_result",
    "tool_use_id", "input_schema", "call_id", "arguments"}

huge_ints = st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 2**1000])
texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)  # surrogates and NUL included
scalars = st.none() | st.booleans() | st.integers(-3, 300) | huge_ints | st.floats(allow_nan=False,
                                                                                  allow_infinity=False) | texts
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(texts, inner, max_size=4),
                      max_leaves=12)
# Decoding constraints: shapes the gateway accepts, holding schemas, regexes and grammars that
# may not compile (the engine compiles them; a failure must still be a 400).
schemas = values | st.fixed_dictionaries({"type": st.sampled_from(["object", "string", "array", "integer", "x"])},
                                         optional={"properties": st.dictionaries(texts, values, max_size=3),
                                                   "pattern": texts, "items": values, "enum": values,
                                                   "required": values, "$ref": texts, "minimum": values})
constraints = st.one_of(
    st.fixed_dictionaries({"response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["json_schema", "json_object", "text", "x"])},
        optional={"json_schema": st.fixed_dictionaries({"name": texts}, optional={"schema": schemas,
                                                                                  "strict": values})})}),
    st.fixed_dictionaries({"structured_outputs": st.dictionaries(
        st.sampled_from(["json", "json_object", "regex", "choice", "grammar", "structural_tag", "x"]),
        schemas | texts, min_size=1, max_size=2)}),
    st.fixed_dictionaries({"guided_regex": texts}), st.fixed_dictionaries({"guided_grammar": texts}),
    st.fixed_dictionaries({"guided_choice": st.lists(texts, max_size=4)}),
    st.fixed_dictionaries({"guided_json": schemas}),
)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES),
                                           "content": texts | values}), max_size=3)
# Content blocks (Anthropic) and input items (Responses): known and unknown types, any field values.
blocks = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result", "image", "x"])},
                                        optional={"text": values, "id": values, "name": values, "input": values,
                                                  "tool_use_id": values, "content": values}), max_size=3)
anthropic_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": texts | blocks}),
                              max_size=3)
input_items = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "x"])},
    optional={"role": st.sampled_from(ROLES), "content": texts | blocks | values, "call_id": values,
              "name": values, "arguments": values, "output": values}), max_size=3)


@st.composite
def bodies(draw: st.DrawFn, route: str) -> dict:
    body: dict = {}
    if draw(st.booleans()):
        body["model"] = "tiny"
    if route in ("/v1/completions", "/tokenize") and draw(st.booleans()):
        body["prompt"] = draw(texts | st.lists(st.integers(0, 600), max_size=8))
    if route in ("/v1/chat/completions", "/tokenize") and draw(st.booleans()):
        body["messages"] = draw(messages)
    if route in ANTHROPIC_ROUTES and draw(st.booleans()):
        body["messages"] = draw(anthropic_messages)
    if route == "/v1/responses" and draw(st.booleans()):
        body["input"] = draw(texts | input_items)
    if route == "/detokenize" and draw(st.booleans()):
        body["tokens"] = draw(st.lists(st.integers(-2, 600) | huge_ints, max_size=8))
    for name in draw(st.lists(st.sampled_from(ROUTES[route]), max_size=4, unique=True)):
        body[name] = draw(values)
    if route in ("/v1/completions", "/v1/chat/completions") and draw(st.integers(0, 3)) == 0:
        body.update(draw(constraints))
    length = "max_output_tokens" if route == "/v1/responses" else "max_tokens"
    if length not in body:
        body[length] = 4  # a request that is valid by chance stays short
    return body


def _encode(draw: st.DrawFn, body: dict) -> tuple[bytes, list[bytes]]:
    """The body's bytes, and the raw byte runs spliced into it (must not come back)."""
    try:
        text = json.dumps(body, ensure_ascii=draw(st.booleans()))
    except (ValueError, RecursionError):
        text = "{}"
    how = draw(st.sampled_from(["utf-8", "surrogatepass", "utf-16", "utf-16-be", "utf-32", "latin-1", "splice",
                                "truncate", "deep", "huge_array", "huge_number", "escaped_surrogate"]))
    spliced: list[bytes] = []
    if how == "utf-8":
        data = text.encode("utf-8", "replace")
    elif how == "surrogatepass":
        data = text.encode("utf-8", "surrogatepass")
    elif how in ("utf-16", "utf-16-be", "utf-32"):
        data = text.encode(how, "surrogatepass")
    elif how == "latin-1":
        data = text.encode("latin-1", "replace")
    elif how == "splice":
        raw = draw(st.binary(min_size=1, max_size=24))
        data = text.encode("utf-8", "surrogatepass")
        at = draw(st.integers(0, len(data)))
        data = data[:at] + raw + data[at:]
        spliced.append(raw)
    elif how == "truncate":
        data = text.encode("utf-8", "surrogatepass")
        data = data[:draw(st.integers(0, max(0, len(data) - 1)))]
    elif how == "deep":
        depth = draw(st.sampled_from([50, 999, 5000, 100_000]))
        field = draw(st.sampled_from(["prompt", "messages", "stop", "tokens", "logit_bias"]))
        data = ('{"' + field + '": ' + "[" * depth + "]" * depth + "}").encode()
    elif how == "huge_array":
        field = draw(st.sampled_from(["prompt", "stop", "tokens", "stop_token_ids", "messages"]))
        item = draw(st.sampled_from(["0", '"a"', "{}", "[]", "null"]))
        data = ('{"' + field + '": [' + ",".join([item] * 150_000) + "]}").encode()
    elif how == "huge_number":
        field = draw(st.sampled_from(["max_tokens", "n", "seed", "temperature", "top_k", "timeout", "logprobs"]))
        digits = draw(st.sampled_from([20, 400, 5000, 100_000]))
        number = draw(st.sampled_from(["1" + "0" * digits, "-" + "9" * digits, "1e" + "9" * min(digits, 400),
                                       "0." + "1" * digits]))
        data = ('{"model": "tiny", "prompt": "hi", "' + field + '": ' + number + "}").encode()
    else:
        field = draw(st.sampled_from(["prompt", "model", "stop", "cache_salt", "user"]))
        escape = draw(st.sampled_from(["\\ud800", "\\udfff", "\\ud800\\ud800", "\\udc00\\ud800", "\\u0000"]))
        data = ('{"model": "tiny", "' + field + '": "a' + escape + 'b", "max_tokens": 2}').encode()
    return data, spliced


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (_strings(k) + _strings(v))]
    return []


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes, list[str], list[bytes]]:
    route = draw(st.sampled_from(sorted(ROUTES)))
    body = draw(bodies(route))
    data, spliced = _encode(draw, body)
    sent = [s for s in _strings(body) if len(s) >= MIN_ECHO and s not in VOCABULARY]
    return route, data, sent, [b for b in spliced if len(b) >= MIN_ECHO]


def _check(route: str, data: bytes, sent: list[str], spliced: list[bytes], status: int, body: bytes) -> None:
    assert status < 500, (route, status, data[:300], body[:300])
    if status >= 400:
        assert len(body) <= MAX_ERROR_BODY, (route, status, len(body))
        error = json.loads(body)["error"]
        if route in ANTHROPIC_ROUTES:
            assert json.loads(body)["type"] == "error" and set(error) == {"type", "message"}, body[:300]
        else:
            assert set(error) == {"message", "type", "param", "code"}, body[:300]
        text = body.decode("utf-8")
        decoded = json.dumps(json.loads(body), ensure_ascii=False)
        for s in sent:
            assert s not in text and s not in decoded, (route, s, body[:300])
        for raw in spliced:
            assert raw not in body, (route, raw, body[:300])
    else:  # a 2xx (a stream's events included) carries no server error either
        assert b'"internal_error"' not in body, (route, data[:300], body[-300:])


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          database=None)
@given(case=requests())
def test_no_byte_sequence_gets_a_5xx_or_an_echo(main_server: Served, case) -> None:
    route, data, sent, spliced = case
    headers = {"Content-Type": "application/json"}
    try:
        reply = main_server.request("POST", route, raw=data, headers=headers)
    except (BrokenPipeError, ConnectionResetError):
        assert len(data) > 1024 * 1024, (route, len(data))  # only an oversized body may be cut off (413)
        return
    _check(route, data, sent, spliced, reply.status, reply.body)


def test_the_server_is_clean_after_fuzzing(main_server: Served) -> None:
    assert main_server.complete(model="tiny", prompt="hi", max_tokens=2)["usage"]["completion_tokens"] == 2
    assert main_server.wait_idle(10.0) == (0, 0, 0)
