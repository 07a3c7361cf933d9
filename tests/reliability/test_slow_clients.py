"""Slow clients cannot hold the gateway's memory or the engine's KV blocks.

- A client that sends a request's head a byte at a time is disconnected after
  --header-timeout (aiohttp's keep-alive timer, 3630 s by default, was the only bound).
- A body that does not arrive within --body-timeout gets a 408 and the connection closes.
- A streaming client that stops reading: the gateway kept pulling the engine's output into
  an unbounded queue while its socket was full, and the engine generated to the end. Past
  --max-stream-buffer-bytes unread, the request is cancelled (its blocks freed) and the
  connection dropped.
- A streaming client that reads nothing at all, with its output under that cap: the handler
  waited on the full socket for ever (and the engine generated to the end). After --write-timeout
  seconds without a byte leaving, the request is cancelled and the connection dropped; a slow
  client that keeps reading a little is not.
"""
from __future__ import annotations

import json
import socket
import time

import pytest

from tests.conftest import tiny_model
from tests.reliability.served import Served, start_served

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_TOKENS, N = 1900, 8
WRITE_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def strict_server():
    served = start_served(["--model", tiny_model("llama"), "--served-model-name", "tiny", "--max-model-len", "2048",
                           "--header-timeout", str(HEADER_TIMEOUT_S), "--body-timeout", str(BODY_TIMEOUT_S),
                           "--max-stream-buffer-bytes", "64KiB", "--max-num-seqs", "16"])
    try:
        yield served
    finally:
        served.stop(timeout=60)


def _closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> tuple[bool, bytes]:
    """Send `trickle` a byte every 0.2 s (while the server lets us); True once the server closed."""
    deadline, got = time.monotonic() + seconds, b""
    sock.settimeout(0.2)
    sent = 0
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
            if not chunk:
                return True, got
            got += chunk
        except socket.timeout:
            pass
        except ConnectionResetError:
            return True, got
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent:sent + 1])
                sent += 1
            except (BrokenPipeError, ConnectionResetError):
                return True, got
    return False, got


def test_a_head_sent_a_byte_at_a_time_is_cut_off(strict_server: Served) -> None:
    with socket.create_connection((strict_server.host, strict_server.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        closed, _ = _closed_within(sock, HEADER_TIMEOUT_S + 4, trickle=b"X-Slow: " + b"a" * 100)
        assert closed, "the server kept a connection open that never finished its request head"
    # An idle connection is closed too; one that sends its request at once is served.
    with socket.create_connection((strict_server.host, strict_server.port), timeout=10) as sock:
        assert _closed_within(sock, HEADER_TIMEOUT_S + 4)[0]
    assert strict_server.get("/health", key=None).status == 200


def test_a_body_that_does_not_arrive_is_a_408(strict_server: Served) -> None:
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode()
    with socket.create_connection((strict_server.host, strict_server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        start = time.monotonic()
        closed, got = _closed_within(sock, BODY_TIMEOUT_S + 3, trickle=body[5:15])
        assert got.startswith(b"HTTP/1.1 408 "), got[:300]  # answered at the deadline
        # Then closed, at the latest after aiohttp's lingering read of what is still sent (10 s).
        closed = closed or _closed_within(sock, 12, trickle=body[15:])[0]
        assert closed and time.monotonic() - start < BODY_TIMEOUT_S + 15
    head, _, payload = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), got[:300]
    assert json.loads(payload)["error"]["code"] == "body_timeout"
    assert strict_server.wait_idle(2.0) == (0, 0, 0)


def test_a_stream_nobody_reads_is_cancelled_and_frees_its_blocks(strict_server: Served) -> None:
    before = strict_server.metrics().get("kvserve:generation_tokens_total", 0.0)
    mark = strict_server.log_mark()
    body = json.dumps({"model": "tiny", "prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "n": N,
                       "ignore_eos": True, "logprobs": 5, "stream": True, "temperature": 1.0}).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's socket fills
    sock.connect((strict_server.host, strict_server.port))
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        # Never read. The request must end (cancelled) long before its N x MAX_TOKENS tokens.
        deadline = time.monotonic() + 60
        state = strict_server.engine_state()
        while time.monotonic() < deadline:
            time.sleep(0.2)
            state = strict_server.engine_state()
            if state == (0, 0, 0) and any("client left over" in line for line in strict_server.logs_since(mark)):
                break
        assert state == (0, 0, 0), state
        generated = strict_server.metrics().get("kvserve:generation_tokens_total", 0.0) - before
        assert generated < N * MAX_TOKENS / 2, generated
        assert any("client left over" in line for line in strict_server.logs_since(mark))
    finally:
        sock.close()
    # The server serves the next client normally.
    reply = strict_server.post("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": True})
    assert reply.status == 200 and reply.body.rstrip().endswith(b"data: [DONE]")


@pytest.fixture(scope="module")
def stall_server():
    # A cap no test output reaches: only the write timeout can end a stream nobody reads.
    served = start_served(["--model", tiny_model("llama"), "--served-model-name", "tiny", "--max-model-len", "2048",
                           "--write-timeout", str(WRITE_TIMEOUT_S), "--max-stream-buffer-bytes", "1GiB",
                           "--max-num-seqs", "16"])
    try:
        yield served
    finally:
        served.stop(timeout=60)


def _stream_request(served: Served, max_tokens: int, n: int) -> socket.socket:
    body = json.dumps({"model": "tiny", "prompt": "Once upon a time", "max_tokens": max_tokens, "n": n,
                       "ignore_eos": True, "logprobs": 5, "stream": True, "temperature": 1.0}).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's socket fills
    sock.connect((served.host, served.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def _stalled(served: Served, mark: int) -> bool:
    return any("read nothing" in line for line in served.logs_since(mark))


def test_a_stream_whose_client_reads_nothing_is_cancelled_after_the_write_timeout(stall_server: Served) -> None:
    mark = stall_server.log_mark()
    sock = _stream_request(stall_server, MAX_TOKENS, N)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (_stalled(stall_server, mark)
                                                   and stall_server.engine_state() == (0, 0, 0)):
            time.sleep(0.2)
        assert _stalled(stall_server, mark), "no write-timeout cancel within 60 s"
        assert stall_server.engine_state() == (0, 0, 0)  # the engine aborted it: every block back
        # The gateway dropped the connection: what is queued can be read, then the stream ends.
        closed, _ = _closed_within(sock, 15)
        assert closed, "the connection of a cancelled stream stayed open"
    finally:
        sock.close()
    reply = stall_server.post("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": True})
    assert reply.status == 200 and reply.body.rstrip().endswith(b"data: [DONE]")


def test_a_slow_reader_that_keeps_reading_is_not_cut_off(stall_server: Served) -> None:
    mark = stall_server.log_mark()
    sock = _stream_request(stall_server, MAX_TOKENS, 1)
    got = 0
    try:
        sock.settimeout(5)
        end = time.monotonic() + 3 * WRITE_TIMEOUT_S
        while time.monotonic() < end:
            chunk = sock.recv(2048)
            assert chunk, f"the server closed a stream that was being read ({got} bytes in)"
            got += len(chunk)
            time.sleep(0.3)  # ~7 KB/s against output of ~1 KB a token: the server's buffers stay full
        assert not _stalled(stall_server, mark)
    finally:
        sock.close()
