"""The Responses and Messages routes ride the chat completions path: a client that leaves their
stream cancels the backend request at once, and each route has its own request counter label."""
from __future__ import annotations

import http.client
import json
import socket

import pytest

from gw_fakes import get, post

SLOW_BODIES = {
    "/v1/responses": {"model": "tiny", "input": "SLOW", "stream": True},
    "/v1/messages": {"model": "tiny", "max_tokens": 100, "stream": True,
                     "messages": [{"role": "user", "content": "SLOW"}]},
}


@pytest.mark.parametrize("path", sorted(SLOW_BODIES))
def test_leaving_the_stream_cancels_the_backend_request(server, path) -> None:
    before = len(server.backend.cancelled)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("POST", path, body=json.dumps(SLOW_BODIES[path]), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    deltas = 0
    while deltas < 3:  # a few tokens in
        line = resp.fp.readline()
        deltas += line.startswith(b"event: response.output_text.delta") or line.startswith(b"event: content_block_delta")
    rid = server.backend.requests[-1].request_id
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    assert server.wait_cancelled(before + 1, timeout_s=2.0) < 1.0
    assert rid in server.backend.cancelled


def test_each_route_has_its_own_request_counter_label(server) -> None:
    assert post(f"{server.url}/v1/responses", {"input": "hi", "max_output_tokens": 2}).status == 200
    assert post(f"{server.url}/v1/messages", {"model": "tiny", "max_tokens": 2,
                                              "messages": [{"role": "user", "content": "hi"}]}).status == 200
    assert post(f"{server.url}/v1/messages", {"model": "tiny"}).status == 400
    assert get(f"{server.url}/v1/responses/resp_none").status == 404
    metrics = get(f"{server.url}/metrics").text
    for series in ('route="/v1/responses",status="200"', 'route="/v1/messages",status="200"',
                   'route="/v1/messages",status="400"', 'route="/v1/responses/{response_id}",status="404"'):
        assert f"kvserve:http_requests_total{{{series}}}" in metrics, series
