"""Error statuses and OpenAI error objects, never a traceback."""
from __future__ import annotations

import json
import logging
import time

import openai
import pytest

from conftest import API_KEY
from gw_fakes import get, http, post


def error_of(reply) -> dict:
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_wrong_or_missing_api_key_is_401(secured) -> None:
    bad = openai.OpenAI(base_url=f"{secured.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.completions.create(model="tiny", prompt="x", max_tokens=1)
    assert info.value.status_code == 401
    for path in ("/v1/models", "/tokenize"):
        r = http("GET" if path == "/v1/models" else "POST", secured.url + path, json_body=None if path == "/v1/models" else {"prompt": "x"})
        assert r.status == 401 and error_of(r)["code"] == "invalid_api_key"
    good = openai.OpenAI(base_url=f"{secured.url}/v1", api_key=API_KEY, max_retries=0)
    assert good.completions.create(model="tiny", prompt="x", max_tokens=1).choices[0].text == "alpha"


def test_open_routes_need_no_key(secured) -> None:
    for path in ("/health", "/metrics", "/version"):
        assert get(secured.url + path).status == 200, path
    # Everything else needs the key, the API description and unknown routes included.
    for path in ("/openapi.json", "/no/such/route"):
        assert get(secured.url + path).status == 401, path


def test_invalid_field_is_400_with_param(client: openai.OpenAI) -> None:
    cases = [
        ({"temperature": 3}, "temperature"),
        ({"n": 0}, "n"),
        ({"extra_body": {"top_p": 0}}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"extra_body": {"logit_bias": {"x": 1}}}, "logit_bias"),
        ({"stop": ["ok", 5]}, "stop"),
        ({"extra_body": {"stream_options": "yes"}}, "stream_options"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="tiny", prompt="x", **kwargs)
        assert info.value.status_code == 400
        assert info.value.body["param"] == param, kwargs
        assert info.value.body["type"] == "invalid_request_error"


def test_bool_is_not_an_integer(server) -> None:
    r = post(f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": True})
    assert r.status == 400 and error_of(r)["param"] == "max_tokens"


def test_unsupported_features_are_clear_400s(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "xml"})
    assert info.value.body["param"] == "response_format" and "not supported" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_chat_template_refusal_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "assistant", "content": "x"}])
    assert info.value.body["param"] == "messages"
    assert "must not start with assistant" in info.value.body["message"]


def test_backend_rejection_maps_to_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="REJECT", max_tokens=1)
    assert info.value.body["param"] == "temperature"
    # Engine-side errors arrive before any token: a stream still gets a real 400, not a 200.
    with pytest.raises(openai.BadRequestError) as info:
        list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "TOOLONG"}], stream=True))
    assert info.value.body["code"] == "context_length_exceeded" and info.value.body["param"] == "messages"


def test_gateway_checks_context_length_when_known(secured) -> None:
    good = openai.OpenAI(base_url=f"{secured.url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        good.completions.create(model="tiny", prompt=list(range(60)), max_tokens=10)
    assert info.value.body["code"] == "context_length_exceeded"
    # chat without max_tokens gets "up to the context limit" (64 - prompt)
    good.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert secured.backend.requests[-1].sampling["max_tokens"] == 64 - len(secured.backend.requests[-1].prompt)


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-99", prompt="x")
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"


def test_unknown_route_404_wrong_method_405(server) -> None:
    r = get(f"{server.url}/v1/nothing")
    assert r.status == 404 and error_of(r)["code"] == "not_found"
    r = get(f"{server.url}/v1/completions")
    assert r.status == 405 and "POST" in r.headers["allow"] and error_of(r)["code"] == "method_not_allowed"


def test_body_too_large_is_413(server) -> None:
    big = {"prompt": "x" * (80 * 1024)}  # the test server's limit is 64 KiB
    r = post(f"{server.url}/v1/completions", big)
    assert r.status == 413 and error_of(r)["code"] == "request_too_large"
    assert len(r.body) < 1000  # the prompt is not echoed


def test_chunked_body_too_large_is_413(server) -> None:
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    payload = json.dumps({"prompt": "y" * (80 * 1024)}).encode()
    chunks = (payload[i:i + 8192] for i in range(0, len(payload), 8192))
    conn.request("POST", "/v1/completions", body=chunks, headers={"Content-Type": "application/json"}, encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()


def test_non_json_is_415_and_bad_json_400(server) -> None:
    r = http("POST", f"{server.url}/v1/completions", data=b"prompt=x", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status == 415 and error_of(r)["type"] == "invalid_request_error"
    r = http("POST", f"{server.url}/v1/completions", data=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status == 400 and "JSON" in error_of(r)["message"]
    r = post(f"{server.url}/v1/completions", [1, 2])
    assert r.status == 400
    r = http("POST", f"{server.url}/v1/completions", data=b'{"prompt": "x"}', headers={})  # no Content-Type: JSON
    assert r.status == 200, r.body
    # ...but not from a web page: a body without Content-Type is how a page posts cross-site unasked
    r = http("POST", f"{server.url}/v1/completions", data=b'{"prompt": "x"}', headers={"Origin": "https://a.example"})
    assert r.status == 415


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_body_that_does_not_decompress_is_400(server, encoding) -> None:
    # aiohttp decompresses by Content-Encoding as it reads, and a body that is not what the
    # header says fails inside request.read(): the client's mistake, not the server's.
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    r = http("POST", f"{server.url}/v1/completions", data=b"not compressed", headers=headers)
    assert r.status == 400 and error_of(r)["code"] is None and "Content-Encoding" in error_of(r)["message"]
    r = http("POST", f"{server.url}/v1/messages", data=b"not compressed", headers=headers)
    assert r.status == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert post(f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": 1}).status == 200


def test_an_undecodable_body_logs_no_server_error(server, caplog) -> None:
    # After the 400, aiohttp reads what is left of the body before it closes the connection, and
    # the decoder fails again there: the client's malformed body, not an unhandled server error.
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
        assert http("POST", f"{server.url}/v1/completions", data=b"not compressed", headers=headers).status == 400
        assert post(f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": 1}).status == 200
        time.sleep(0.2)  # the lingering read runs after the response went out
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert records and all(r.levelno < logging.WARNING for r in records), [(r.levelname, r.msg) for r in records]


def test_messages_are_bounded_and_do_not_echo_input(server) -> None:
    r = post(f"{server.url}/v1/completions", {"prompt": "x", "model": "m" * 400})
    err = error_of(r)
    assert r.status == 404 and len(err["message"]) < 200


def test_backend_not_ready_is_503(server) -> None:
    server.backend.is_ready = False
    server.gateway.readiness.invalidate()
    try:
        r = post(f"{server.url}/v1/completions", {"prompt": "x"})
        assert r.status == 503 and error_of(r)["type"] == "service_unavailable"
    finally:
        server.backend.is_ready = True
        server.gateway.readiness.invalidate()


def test_backend_transport_failure_is_503(server) -> None:
    r = post(f"{server.url}/v1/completions", {"prompt": "OFFLINE"})
    assert r.status == 503
    server.gateway.readiness.invalidate()


def test_failure_mid_stream_sends_error_event_then_done(server) -> None:
    r = post(f"{server.url}/v1/completions", {"prompt": "CRASH", "stream": True, "max_tokens": 10})
    assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in r.text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["type"] == "internal_server_error" and "exploded" not in err["message"]  # no engine internals
    assert [json.loads(e)["choices"][0]["text"] for e in events[:-2]] == ["alpha", " beta"]


def test_engine_failure_non_streaming_is_500_without_details(server) -> None:
    r = post(f"{server.url}/v1/completions", {"prompt": "CRASH", "max_tokens": 10})
    assert r.status == 500 and error_of(r)["message"] == "internal server error"
