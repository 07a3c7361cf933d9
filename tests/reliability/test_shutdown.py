"""Graceful shutdown: SIGTERM with 32 streams in flight.

Readiness and new requests answer 503 at once; streams that can finish within
--shutdown-timeout finish normally, the others end with an error event and
`[DONE]` at the deadline; the process exits 0 and its embedded host is gone.
"""
from __future__ import annotations

import asyncio
import signal
import time

import psutil

from tests.conftest import tiny_model
from tests.reliability.served import start_served
from tests.reliability.sse_client import StreamResult, new_session, stream

SHUTDOWN_TIMEOUT_S = 5.0
SHORT, LONG = 60, 1800  # max_tokens: done well within the timeout / far from done at it


def test_sigterm_drains_streams_then_exits_cleanly() -> None:
    served = start_served(["--model", tiny_model("llama"), "--served-model-name", "tiny", "--max-num-seqs", "32",
                           "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)])
    try:
        host_pids = served.host_pids()
        assert host_pids, "the embedded host child was not found"
        body = {"model": "tiny", "prompt": "Once upon a time", "temperature": 0, "ignore_eos": True}

        async def scenario():
            async with new_session() as session:
                tasks = [asyncio.create_task(stream(session, served, "/v1/completions",
                                                    {**body, "max_tokens": SHORT if i % 2 else LONG}, timeout=40))
                         for i in range(32)]
                # Every stream is running (its first chunk arrived) before the signal.
                deadline = time.monotonic() + 30
                while (await asyncio.to_thread(served.metrics))["kvserve:num_requests_running"] < 32:
                    assert time.monotonic() < deadline, "the 32 streams never ran together"
                    await asyncio.sleep(0.05)
                in_flight = [not t.done() for t in tasks]
                sent = time.monotonic()
                served.proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.2)
                health = await asyncio.to_thread(served.get, "/health")
                fresh = await asyncio.to_thread(served.post, "/v1/completions", {**body, "max_tokens": 2})
                results: list[StreamResult] = await asyncio.wait_for(asyncio.gather(*tasks), 40)
                return in_flight, sent, health, fresh, results

        in_flight, sent, health, fresh, results = asyncio.run(scenario())
        code = served.proc.wait(timeout=SHUTDOWN_TIMEOUT_S + 20)
        exited = time.monotonic() - sent
    finally:
        served.kill()

    assert all(in_flight)
    assert health.status == 503 and health.json()["error"]["code"] == "shutting_down"
    assert fresh.status == 503 and fresh.json()["error"]["code"] == "shutting_down"
    assert fresh.headers.get("retry-after") == "1"
    finished, cut = 0, 0
    for i, res in enumerate(results):
        assert res.status == 200 and res.done, (i, res.status, res.body[:200])  # every stream got [DONE]
        if res.error is None:
            assert res.finish_reasons == ["length"] and len(res.frames) > 1
            finished += 1
        else:
            assert res.error["code"] == "shutting_down" and res.finish_reasons == [], res.error
            cut += 1
    assert finished >= 16 and cut >= 1, (finished, cut)  # the short ones made it; the long ones were cut
    assert code == 0
    assert exited < SHUTDOWN_TIMEOUT_S + 15, exited
    for pid in host_pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
    assert "Traceback" not in "".join(served.logs)
