"""A fault in the model forward pass (KVSERVE_FAULT_INJECTION_STEP: the engine's
N-th step raises, once).

Documented behaviour (docs/security.md, "Failures"): every request in flight at the
fault ends at once, a stream with an SSE error event then `data: [DONE]`, a
non-streaming call with a 500 error object; the engine forgets its prefix
cache, keeps running and takes new requests; the model reports not ready for
3 s after the fault, so `/health` answers 503 in that window and 200 after.
Neither the clients nor the logs see a traceback, a file path or the prompt.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.conftest import tiny_model
from tests.reliability.served import Served, start_served
from tests.reliability.sse_client import new_session, stream

FAULT_STEP = 150
CANARY = "CANARY-41d2e8-FAULT"
LEAKS = (CANARY, "Traceback", 'File "', ".py", "/work/", "site-packages")


@pytest.fixture(scope="module")
def fault_server():
    served = start_served(["--model", tiny_model("llama"), "--served-model-name", "tiny", "--max-num-seqs", "16",
                           "--max-model-len", "512"],
                          env={"KVSERVE_FAULT_INJECTION_STEP": str(FAULT_STEP)})
    try:
        yield served
    finally:
        assert served.stop(timeout=60) == 0


def test_engine_fault_fails_in_flight_requests_and_recovers(fault_server: Served) -> None:
    served = fault_server
    mark = served.log_mark()
    body = {"model": "tiny", "max_tokens": 400, "temperature": 0, "ignore_eos": True}

    async def in_flight():
        async with new_session() as session:
            streams = [stream(session, served, "/v1/completions", {**body, "prompt": f"{CANARY} story {i}"}, timeout=30)
                       for i in range(8)]

            async def whole():
                async with session.post(served.url + "/v1/completions",
                                        json={**body, "prompt": f"{CANARY} whole"}) as resp:
                    return resp.status, await resp.read()

            return await asyncio.wait_for(asyncio.gather(whole(), *streams), 60)

    start = time.monotonic()
    (status, raw), *results = asyncio.run(in_flight())
    assert time.monotonic() - start < 30  # nobody hung
    health_after_fault = served.get("/health").status

    # Non-streaming: a 500 with an error object that says nothing internal.
    assert status == 500, raw[:300]
    assert b'"internal_error"' in raw and not any(leak.encode() in raw for leak in LEAKS), raw
    # Streaming: an error event, then [DONE]; no normal finish.
    for res in results:
        assert res.status == 200 and res.done, (res.status, res.body[:200])
        assert res.error is not None and res.error["code"] == "internal_error", res.events()[-1:]
        assert res.finish_reasons == []
        assert not any(leak.encode() in f for f in res.frames for leak in LEAKS)

    # Readiness reflects the fault, then the engine's recovery.
    assert health_after_fault == 503
    deadline = time.monotonic() + 15
    while served.get("/health").status != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert served.get("/health").status == 200
    out = served.complete(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert out["choices"][0]["finish_reason"] == "length"
    assert served.wait_idle(2.0) == (0, 0, 0)

    # The logs say what happened without a traceback, a path or the prompt.
    logs = "".join(served.logs_since(mark))
    assert "engine step failed (InjectedFault)" in logs
    for leak in LEAKS:
        assert leak not in logs, leak
