"""The log lines of one request, from the gateway and the backend process: one
request_id and one trace_id on all of them; the prompt only with --log-requests.
"""
from __future__ import annotations

import json
import secrets

from tests.observability_e2e.obs_e2e_support import Server, new_traceparent, run_server

CANARY = "zebracanary"


def _send(server: Server) -> tuple[str, str, str]:
    """One streamed chat with a canary in the prompt; (request id, trace id, response id)."""
    header, trace_id, _ = new_traceparent()
    rid = "obs-log-" + secrets.token_hex(4)
    chunks = server.stream_chat({"messages": [{"role": "user", "content": f"Repeat {CANARY} for me."}],
                                 "max_tokens": 6, "ignore_eos": True},
                                {"traceparent": header, "X-Request-Id": rid})
    return rid, trace_id, chunks[0]["id"]


def _mentions(line: str, *needles: str) -> bool:
    return any(n in line for n in needles)


def test_default_json_lines_share_ids_and_never_hold_the_prompt(traced_server: Server) -> None:
    rid, trace_id, response_id = _send(traced_server)
    lines = traced_server.wait_for_log(lambda line: "request finished" in line and rid in line)

    records = []
    for line in lines:  # structlog JSON, every line of both processes
        assert line.startswith("{"), line
        records.append(json.loads(line))
    mine = [r for r in records if _mentions(json.dumps(r), rid, trace_id, response_id)]
    for record in mine:
        assert record["request_id"] == rid and record["trace_id"] == trace_id, record
    by_event = {r["event"]: r for r in mine if r["logger"] == "kvserve.backend.requests"}
    assert set(by_event) == {"request queued", "request finished"}, mine
    assert response_id == f"chatcmpl-{rid}"  # as vLLM names it: the client's X-Request-Id
    # the engine's own id (a client's id need not be unique), linked to the response by request_id
    assert by_event["request queued"]["engine_request_id"].startswith("chatcmpl-")
    assert rid not in by_event["request queued"]["engine_request_id"]
    assert by_event["request finished"]["completion_tokens"] == 6
    assert by_event["request finished"]["finish_reason"] == "length"
    assert "prompt" not in by_event["request queued"]
    assert not any(CANARY in line for line in lines)


def test_log_requests_logs_the_prompt_and_console_format_keeps_the_ids(llama_dir: str) -> None:
    with run_server(llama_dir, ["--log-requests", "--log-format", "console"], {"OTEL_TRACES_EXPORTER": "none"}) as server:
        rid, trace_id, response_id = _send(server)
        server.wait_for_log(lambda line: "request finished" in line and rid in line)
        lines = server.wait_for_log(lambda line: "http request" in line and rid in line)

    assert not any(line.lstrip().startswith("{") for line in lines)  # key=value lines, not JSON
    mine = [line for line in lines if _mentions(line, rid, trace_id, response_id)]
    for line in mine:
        assert f"request_id={rid}" in line and f"trace_id={trace_id}" in line, line
    gateway = [line for line in mine if "[kvserve.frontend.http]" in line]
    backend = [line for line in mine if "[kvserve.backend.requests]" in line]
    assert len(gateway) == 1 and "status=200" in gateway[0]
    assert len(backend) == 2
    assert any(CANARY in line for line in backend)  # the prompt, because of --log-requests
