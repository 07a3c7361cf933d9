"""No error body quotes the request back: not its path or query, not its method, not a header,
not a value from its body (the model name included). A reflected byte is a channel for
whoever can make a victim's client send it; and the client already knows what it sent."""
from __future__ import annotations

import http.client
import json
import socket

from tests.reliability.served import Reply, Served

CANARY = "canary7d41e0"


def _no_echo(what: str, reply: Reply) -> None:
    assert 400 <= reply.status < 500, (what, reply.status)
    assert reply.headers.get("content-type", "").startswith("application/json"), what
    assert CANARY.encode() not in reply.body.lower(), (what, reply.body)
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}, what


def _raw_method(served: Served, method: str, path: str) -> Reply:
    conn = http.client.HTTPConnection(served.host, served.port, timeout=30)
    try:
        conn.request(method, path, headers=served.auth())
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def test_404_and_405_bodies_quote_nothing_of_the_request(main_server: Served) -> None:
    for path in (f"/v1/{CANARY}", f"/{CANARY}/x?{CANARY}=1", f"/v1/models/{CANARY}/x", f"/v1/chat/{CANARY}"):
        reply = main_server.get(path, headers={"X-Test": CANARY})
        assert reply.status == 404 and reply.json()["error"]["code"] == "not_found", path
        _no_echo(path, reply)
    for method, path in (("GET", f"/v1/completions?{CANARY}"), ("PUT", "/v1/chat/completions"),
                         ("DELETE", "/tokenize")):
        reply = _raw_method(main_server, method, path)
        assert reply.status == 405 and "POST" in reply.headers["allow"], (method, path, reply.status)
        _no_echo(f"{method} {path}", reply)


def test_requests_the_http_parser_refuses_quote_nothing(main_server: Served) -> None:
    """aiohttp's own answer to these quoted the offending request line or header back."""
    for head in (f"{CANARY.upper()} /v1/completions HTTP/1.1\r\nHost: localhost\r\n\r\n",
                 f"GET /health HTTP/1.1\r\nHost: localhost\r\nX-{CANARY}: {'a' * 9000}\r\n\r\n",
                 f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
                 f"{CANARY}\r\nxx\r\n0\r\n\r\n"):
        with socket.create_connection((main_server.host, main_server.port), timeout=10) as sock:
            sock.sendall(head.encode())
            data = b""
            while chunk := sock.recv(65536):  # the server closes the connection after its answer
                data += chunk
        status_line, _, rest = data.partition(b"\r\n")
        assert b" 400 " in status_line, data[:300]
        body = rest.partition(b"\r\n\r\n")[2]
        assert json.loads(body)["error"]["code"] == "bad_http_request", body
        assert CANARY.encode() not in data.lower(), data[:300]


def test_unknown_model_is_not_quoted(main_server: Served) -> None:
    for path, body in (("/v1/completions", {"model": CANARY, "prompt": "hi"}),
                       ("/v1/chat/completions", {"model": CANARY, "messages": [{"role": "user", "content": "hi"}]}),
                       (f"/v1/models/{CANARY}", None)):
        reply = main_server.get(path) if body is None else main_server.post(path, body)
        assert reply.status == 404 and reply.json()["error"]["code"] == "model_not_found", path
        _no_echo(path, reply)
    reply = main_server.post("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                      "response_format": {"type": CANARY}})
    assert reply.status == 400
    _no_echo("response_format", reply)
