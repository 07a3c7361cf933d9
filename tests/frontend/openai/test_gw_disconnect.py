"""A client that goes away cancels its backend request at once."""
from __future__ import annotations

import http.client
import json
import re
import socket
import time

import openai

from gw_fakes import get


# Seconds a disconnect may take to reach the backend (see the first test).
_CANCEL_BOUND_S = 5.0


def _metric(server, name: str) -> float:
    text = get(f"{server.url}/metrics").text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def test_streaming_disconnect_cancels_backend_request(server) -> None:
    before = len(server.backend.cancelled)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    body = json.dumps({"prompt": "SLOW", "stream": True})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    seen = 0
    while seen < 3:
        line = resp.fp.readline()
        seen += line.startswith(b"data: ")
    rid = server.backend.requests[-1].request_id
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    # "SLOW" never ends on its own, so any cancellation is the disconnect's. The bound is loose
    # because a full suite on 2 busy cores took 1.1 s once; a gateway that waited for its write
    # timeout (30 s) would still fail it.
    server.wait_cancelled(before + 1, timeout_s=_CANCEL_BOUND_S)
    assert rid in server.backend.cancelled
    deadline = time.monotonic() + 2
    while _metric(server, "kvserve:http_streams_in_flight") != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _metric(server, "kvserve:http_streams_in_flight") == 0


def test_non_streaming_disconnect_cancels_backend_request(server) -> None:
    before = len(server.backend.cancelled)
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"prompt": "SLOW", "n": 2}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    deadline = time.monotonic() + 2
    while not any(r.prompt == "SLOW" and r.sampling.get("n") == 2 for r in server.backend.requests):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)  # a few tokens in
    sock.close()
    server.wait_cancelled(before + 1, timeout_s=_CANCEL_BOUND_S)


def test_openai_stream_closed_early_cancels(server, client: openai.OpenAI) -> None:
    before = len(server.backend.cancelled)
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "SLOW"}], stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    server.wait_cancelled(before + 1, timeout_s=_CANCEL_BOUND_S)


def test_finished_requests_are_not_cancelled(server, client: openai.OpenAI) -> None:
    before = len(server.backend.cancelled)
    client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=2)
    list(client.completions.create(model="tiny", prompt="a", max_tokens=2, stream=True))
    assert len(server.backend.cancelled) == before
