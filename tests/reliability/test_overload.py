"""Overload and deadlines, on the cycle server (one running sequence, a waiting
queue of two: `--max-num-seqs 1 --max-waiting-requests 2`).

- Beyond the queue limit: 503 with Retry-After and an OpenAI error object,
  answered at once (the engine is not asked to do anything).
- A request's own `timeout` (kvserve extension field): it ends with an error
  event (stream) or a 408 error object, and its KV blocks are freed.
"""
from __future__ import annotations

import asyncio
import json
import time

from tests.reliability.served import Served
from tests.reliability.sse_client import StreamResult, new_session, stream

LONG = {"model": "cycle", "prompt": "Hello", "max_tokens": 1000, "temperature": 0, "ignore_eos": True}


async def _wait_metric(served: Served, name: str, value: float, within_s: float) -> float:
    deadline = time.monotonic() + within_s
    current = (await asyncio.to_thread(served.metrics))[name]
    while current != value and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        current = (await asyncio.to_thread(served.metrics))[name]
    return current


def test_beyond_the_queue_limit_is_a_fast_503(cycle_server: Served) -> None:
    async def run() -> None:
        async with new_session() as session:
            running = asyncio.create_task(stream(session, cycle_server, "/v1/completions", LONG))
            assert await _wait_metric(cycle_server, "kvserve:num_requests_running", 1, 10) == 1
            queued = [asyncio.create_task(stream(session, cycle_server, "/v1/completions", LONG)) for _ in range(2)]
            assert await _wait_metric(cycle_server, "kvserve:num_requests_waiting", 2, 10) == 2

            async def rejected(i: int) -> tuple[float, object]:
                start = time.monotonic()
                if i % 2:
                    chat = {"model": "cycle", "messages": [{"role": "user", "content": "hi"}]}
                    res: StreamResult = await stream(session, cycle_server, "/v1/chat/completions", chat)
                    return time.monotonic() - start, (res.status, res.headers, res.body)
                async with session.post(cycle_server.url + "/v1/completions", json=LONG) as resp:
                    return time.monotonic() - start, (resp.status, dict(resp.headers), await resp.read())

            answers = await asyncio.gather(*(rejected(i) for i in range(10)))
            for elapsed, (status, headers, body) in answers:
                assert status == 503, (status, body[:200])
                assert headers.get("Retry-After") == "1"
                error = json.loads(body)["error"]
                assert error["code"] == "overloaded" and error["type"] == "service_unavailable"
                assert elapsed < 1.5, elapsed  # refused without waiting for the engine
            # The three accepted requests were untouched by the rejections.
            assert (await asyncio.to_thread(cycle_server.metrics))["kvserve:num_requests_running"] == 1
            for task in [running, *queued]:
                task.cancel()
            await asyncio.gather(running, *queued, return_exceptions=True)

    asyncio.run(asyncio.wait_for(run(), 60))
    assert cycle_server.wait_idle(2.0) == (0, 0, 0)


def test_request_timeout_ends_with_an_error_and_frees_its_blocks(cycle_server: Served) -> None:
    async def run() -> None:
        async with new_session() as session:
            # Running when its deadline passes: some text, then an error event and [DONE].
            start = time.monotonic()
            res = await stream(session, cycle_server, "/v1/completions", {**LONG, "timeout": 0.5})
            assert time.monotonic() - start < 5
            assert res.status == 200 and res.done and res.text
            assert res.error is not None and res.error["code"] == "timeout", res.events()[-1:]
            assert res.finish_reasons == []  # it did not finish normally
            assert await asyncio.to_thread(cycle_server.wait_idle, 2.0) == (0, 0, 0)
            # Not streaming: a 408 error object.
            async with session.post(cycle_server.url + "/v1/completions", json={**LONG, "timeout": 0.3}) as resp:
                body = await resp.json()
                assert resp.status == 408 and body["error"]["code"] == "timeout", body
            assert await asyncio.to_thread(cycle_server.wait_idle, 2.0) == (0, 0, 0)
            # Still queued when its deadline passes (the only slot is taken): refused before any token.
            blocker = asyncio.create_task(stream(session, cycle_server, "/v1/completions", LONG))
            assert await _wait_metric(cycle_server, "kvserve:num_requests_running", 1, 10) == 1
            res = await stream(session, cycle_server, "/v1/completions", {**LONG, "timeout": 0.4})
            assert res.status == 408 and b'"timeout"' in res.body, (res.status, res.body[:200])
            blocker.cancel()
            await asyncio.gather(blocker, return_exceptions=True)

    asyncio.run(asyncio.wait_for(run(), 60))
    assert cycle_server.wait_idle(2.0) == (0, 0, 0)
