"""Gateway side of structured outputs and tool calling, without a server: request fields become
the one `structured_outputs` sampling parameter, tools become a structural tag or a parser, the
conversation renders tool messages, and the tool-call parser reads the same calls from a whole
text as from any cut of it into deltas."""
from __future__ import annotations

import json
import random

import pytest

from kvserve.frontend.backend_client.protocol import BackendRejected
from kvserve.frontend.openai.api_errors import ApiError, from_backend
from kvserve.frontend.openai.api_requests import parse_chat, parse_completion
from kvserve.frontend.openai.tool_parser import HermesToolParser
from kvserve.frontend.openai.tools import ToolSettings, call_block, render_messages

MSGS = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
OTHER = {"type": "function", "function": {"name": "get_time"}}
AUTO = ToolSettings(auto=True, parser="hermes")


def bad(fn, body, *args) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(body, None, *args)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("field, value, wire", [
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}, {"json": SCHEMA}),
    ("response_format", {"type": "json_object"}, {"json_object": True}),
    ("guided_json", SCHEMA, {"json": SCHEMA}),
    ("guided_regex", "[a-z]+", {"regex": "[a-z]+"}),
    ("guided_choice", ["a", "b"], {"choice": ["a", "b"]}),
    ("guided_grammar", 'root ::= "x"', {"grammar": 'root ::= "x"'}),
    ("structured_outputs", {"regex": "a+", "json": None}, {"regex": "a+"}),
    ("structured_outputs", {"structural_tag": {"type": "structural_tag"}}, {"structural_tag": {"type": "structural_tag"}}),
])
def test_constraints_travel_as_structured_outputs(field, value, wire):
    for req in (parse_completion({"prompt": "x", field: value}, None), parse_chat({"messages": MSGS, field: value}, None)):
        assert req.sampling["structured_outputs"] == wire and req.constraint_param == field
    assert "structured_outputs" not in parse_chat({"messages": MSGS, "response_format": {"type": "text"}}, None).sampling


@pytest.mark.parametrize("body, param", [
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, "guided_json"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "disable_any_whitespace": True}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"guided_regex": ""}, "guided_regex"),
    ({"guided_regex": False}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": 5}, "guided_json"),
    ({"guided_json": {"description": "x" * 70_000}}, "guided_json"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "x"}}}, "response_format"),
    ({"response_format": {"type": "text", "json_schema": {"schema": 5}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n" * 65, "schema": {}}}}, "response_format"),
    ({"response_format": {"type": "regex"}}, "response_format"),
    ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
])
def test_bad_constraints_are_400_naming_the_field(body, param):
    err = bad(parse_completion, {"prompt": "x", **body})
    assert err.param == param
    assert "x" * 50 not in err.message


def test_tool_choice_required_and_named_become_a_structural_tag():
    req = parse_chat({"messages": MSGS, "tools": [TOOL, OTHER], "tool_choice": "required"}, None)
    fmt = req.sampling["structured_outputs"]["structural_tag"]["format"]
    assert fmt["type"] == "tags_with_separator" and fmt["at_least_one"] and not fmt["stop_after_first"]
    assert [t["begin"] for t in fmt["tags"]] == [
        '<tool_call>\n{"name": "get_weather", "arguments": ', '<tool_call>\n{"name": "get_time", "arguments": ']
    assert fmt["tags"][0]["content"]["json_schema"] == SCHEMA and fmt["tags"][0]["end"] == "}\n</tool_call>"
    assert fmt["tags"][1]["content"]["json_schema"] == {"type": "object", "properties": {}}
    assert req.constraint_param == "tools" and req.tools.parses_calls
    one = parse_chat({"messages": MSGS, "tools": [TOOL, OTHER], "tool_choice": "required",
                      "parallel_tool_calls": False}, None)
    assert one.sampling["structured_outputs"]["structural_tag"]["format"]["stop_after_first"]
    named = parse_chat({"messages": MSGS, "tools": [TOOL, OTHER],
                        "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, None)
    tag = named.sampling["structured_outputs"]["structural_tag"]["format"]
    assert tag["type"] == "tag" and '"get_time"' in tag["begin"]


def test_auto_and_none_are_not_constrained_and_auto_needs_the_flags():
    assert bad(parse_chat, {"messages": MSGS, "tools": [TOOL]}).param == "tool_choice"  # default is auto
    auto = parse_chat({"messages": MSGS, "tools": [TOOL]}, None, AUTO)
    assert "structured_outputs" not in auto.sampling and auto.tools.choice == "auto" and auto.tools.parses_calls
    none = parse_chat({"messages": MSGS, "tools": [TOOL], "tool_choice": "none"}, None)
    assert "structured_outputs" not in none.sampling and not none.tools.parses_calls


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools"),
    ({"tools": [TOOL, TOOL], "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "required", "guided_json": SCHEMA}, "tool_choice"),
    ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]},
     "messages"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]}, "messages"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]}, "messages"),
])
def test_bad_tool_requests_are_400(body, param):
    assert bad(parse_chat, {"messages": MSGS, **body}, AUTO).param == param
    assert bad(parse_completion, {"prompt": "x", "tools": [TOOL]}).param == "tools"


def test_default_tool_rendering_for_a_template_without_tools():
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"  # no tools section
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "content": '{"t": 18}', "tool_call_id": "call_1"},
            {"role": "tool", "content": '{"t": 19}', "tool_call_id": "call_2"}]
    out, extra = render_messages(msgs, [TOOL], template)
    assert extra == {}
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(TOOL) in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": call_block("get_weather", '{"a": 1}')}
    assert out[3] == {"role": "user", "content": '<tool_response>\n{"t": 18}\n</tool_response>\n'
                                                '<tool_response>\n{"t": 19}\n</tool_response>'}
    assert len(out) == 4
    without_system, _ = render_messages(msgs[1:2], [TOOL], template)
    assert without_system[0]["role"] == "system" and without_system[1] == msgs[1]


def test_a_template_with_tools_gets_them_hf_style():
    template = "{% if tools %}{{ tools | length }}{% endif %}"
    msgs = [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}]
    out, extra = render_messages(msgs, [TOOL], template)
    assert extra == {"tools": [TOOL]} and out[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


TEXT = ('Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris", "n": {"a": 1} }}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments":   {}}\n</tool_call> done <tool_call>{"arguments": {"x": 1}, '
        '"name": "c"}</tool_call><tool_call>garbage</tool_call> <tool_call>\n{"name": "d", "arguments": {"q": [1')


def _run(parser: HermesToolParser, pieces: list[str]):
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
    content = "".join(e.text for e in events if e.kind == "content")
    args: dict[int, str] = {}
    for e in events:
        if e.kind == "arguments":
            args[e.call.index] = args.get(e.call.index, "") + e.text
    starts = [e.call.name for e in events if e.kind == "call"]
    return content, starts, args, [(c.name, c.arguments) for c in parser.calls]


def test_tool_parser_reads_calls_content_and_odd_blocks():
    content, starts, args, calls = _run(HermesToolParser(), [TEXT])
    assert calls == [("get_weather", '{"city": "Pa}ris", "n": {"a": 1} }'), ("b", "{}"), ("c", '{"x": 1}'),
                     ("d", '{"q": [1')]  # the last one was cut off by max_tokens: kept as it was
    assert starts == ["get_weather", "b", "c", "d"]
    # not a call: stays content; whitespace between calls is their separator, not content
    assert content == "Sure.  done<tool_call>garbage</tool_call>"
    assert [args[i] for i in range(4)] == [a for _, a in calls]
    one = _run(HermesToolParser(max_calls=1), [TEXT])
    assert one[3] == calls[:1] and one[0] == "Sure. "


def test_required_calls_give_no_content_and_a_cut_off_tag_is_not_content():
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    for text in (call + "\n" + call + "\n\n" + call, call + "\n<", call + "\n\n<tool", call + '\n<tool_call>\n{"na'):
        for parser in (HermesToolParser(), HermesToolParser(calls_only=True)):
            for cut in range(1, len(text)):  # streamed in two pieces, cut anywhere
                content, _, _, calls = _run(parser.__class__(calls_only=parser.calls_only), [text[:cut], text[cut:]])
                assert content == "" and calls[0] == ("f", '{"a": 1}'), (text, cut)
    # auto: text after a call is still content, the whitespace before it included
    assert _run(HermesToolParser(), [call + "\n Done."])[0] == "\n Done."
    # a `<` that ends free text before any call stays content; calls_only gives out none at all
    assert _run(HermesToolParser(), ["a <"])[0] == "a <"
    assert _run(HermesToolParser(calls_only=True), ["x" + call + "y"])[0] == ""


def test_tool_parser_streams_the_same_calls_however_the_text_is_cut():
    whole = _run(HermesToolParser(), [TEXT])
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(TEXT)), rng.randint(1, 60)))
        pieces = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)])]
        assert _run(HermesToolParser(), pieces) == whole


def test_engine_errors_name_the_field_the_client_used():
    exc = BackendRejected("structured_outputs: the JSON schema keyword 'not' is not supported",
                          param="structured_outputs")
    err = from_backend(exc, prompt_param="messages", constraint_param="response_format")
    assert err.param == "response_format" and err.message.startswith("response_format: the JSON schema keyword")
    assert from_backend(exc, prompt_param="prompt", constraint_param="structured_outputs").param == "structured_outputs"
