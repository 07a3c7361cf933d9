"""SSE framing on the wire: OpenAI's `data: <json>\\n\\n` events and `data: [DONE]`."""
from __future__ import annotations

import json

from kvserve.frontend.http.sse_writer import encode_event, encode_json

from gw_fakes import post


def test_event_encoding_is_exact() -> None:
    assert encode_event("[DONE]") == b"data: [DONE]\n\n"
    assert encode_json({"a": "é", "b": [1, 2]}) == 'data: {"a":"é","b":[1,2]}\n\n'.encode()
    # JSON never spans lines, but a newline inside a string is escaped, so one data line per event.
    assert encode_json({"t": "x\ny"}).count(b"\n") == 2


def test_json_event_is_one_data_line_whatever_the_text() -> None:
    # CR, LF and CRLF are SSE's line breaks; the other Unicode separators are not,
    # and JSON may carry them raw. Each must come back as the same text.
    text = "a\rb\r\nc\u2028d\u2029e\x85f\x00g\U0001F600"
    frame = encode_json({"choices": [{"text": text}]})
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    body = frame[len(b"data: "):-2]
    assert b"\r" not in body and b"\n" not in body
    assert json.loads(body.decode("utf-8")) == {"choices": [{"text": text}]}


def _events(raw: str) -> list[str]:
    assert raw.endswith("\n\n")
    frames = raw.split("\n\n")[:-1]
    assert all(f.startswith("data: ") and "\n" not in f for f in frames)
    return [f[len("data: "):] for f in frames]


def test_chat_stream_on_the_wire(server) -> None:
    r = post(f"{server.url}/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 2,
        "stream_options": {"include_usage": True}})
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    assert len(r.headers["x-request-id"]) == 32
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    first, *middle, usage = chunks
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
    assert first["usage"] is None
    assert [c["choices"][0]["delta"] for c in middle] == [{"content": "alpha"}, {"content": " beta"}]
    assert [c["choices"][0]["finish_reason"] for c in middle] == [None, "length"]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 2
    assert {c["id"] for c in chunks} == {first["id"]} and all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_completion_stream_without_usage_has_no_usage_key(server) -> None:
    r = post(f"{server.url}/v1/completions", {"prompt": "p", "stream": True, "max_tokens": 2})
    events = _events(r.text)
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in c for c in chunks)
    assert [c["choices"][0] for c in chunks] == [
        {"index": 0, "text": "alpha", "logprobs": None, "finish_reason": None},
        {"index": 0, "text": " beta", "logprobs": None, "finish_reason": "length"},
    ]
