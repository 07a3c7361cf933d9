"""record_request_spans: after-the-fact spans under a remote parent."""

from __future__ import annotations

import threading
import time

import pytest

from kvserve.observability import (
    RequestTimeline,
    flush_tracing,
    get_tracer,
    inject_traceparent,
    record_request_spans,
    setup_tracing,
)
from kvserve.observability import semconv as sc

MS = 1_000_000


@pytest.fixture
def traced(receiver, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert setup_tracing(otlp_traces_endpoint=receiver.endpoint)
    return receiver


def _gateway_traceparent() -> tuple[str, str, str]:
    with get_tracer().start_as_current_span("gateway") as span:
        tp = inject_traceparent()["traceparent"]
    ctx = span.get_span_context()
    return tp, f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def test_full_request_tree_with_exact_times(traced):
    tp, trace_id, gateway_span_id = _gateway_traceparent()
    t0 = time.time_ns()
    timeline = RequestTimeline(queued_ns=t0, scheduled_ns=t0 + 10 * MS, first_token_ns=t0 + 50 * MS,
                               preempted_ns=(t0 + 70 * MS, t0 + 90 * MS), finished_ns=t0 + 200 * MS)
    attrs = {sc.GEN_AI_REQUEST_MODEL: "tiny", sc.GEN_AI_USAGE_INPUT_TOKENS: 12,
             sc.GEN_AI_USAGE_OUTPUT_TOKENS: 7, sc.GEN_AI_REQUEST_TEMPERATURE: None}

    # The engine records from its own thread, with no current span there.
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault(
        "ctx", record_request_spans(tp, "req-42", timeline, attrs, finish_reason="stop")))
    worker.start()
    worker.join()
    assert flush_tracing()

    (req,) = traced.wait_for_spans("llm_request")
    assert result["ctx"].span_id == int(req.span_id, 16)
    assert req.trace_id == trace_id and req.parent_span_id == gateway_span_id
    assert req.kind == "SERVER"
    assert (req.start_ns, req.end_ns) == (t0, t0 + 200 * MS)
    assert req.attributes[sc.GEN_AI_REQUEST_ID] == "req-42"
    assert req.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 12
    assert req.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 7
    assert sc.GEN_AI_REQUEST_TEMPERATURE not in req.attributes  # None dropped
    assert req.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert req.attributes[sc.GEN_AI_LATENCY_TIME_IN_QUEUE] == pytest.approx(0.010)
    assert req.attributes[sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] == pytest.approx(0.050)
    assert req.attributes[sc.GEN_AI_LATENCY_E2E] == pytest.approx(0.200)
    assert req.attributes[sc.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE] == pytest.approx(0.150)
    assert req.attributes[sc.KVSERVE_NUM_PREEMPTIONS] == 2
    assert req.event("first_token").time_ns == t0 + 50 * MS
    assert [e.time_ns for e in req.events if e.name == "preempted"] == [t0 + 70 * MS, t0 + 90 * MS]
    assert [e.name for e in req.events] == ["queued", "scheduled", "first_token", "preempted", "preempted",
                                            "finished"]
    assert req.event("finished").attributes == {"finish_reason": "stop"}
    assert req.status_code == "UNSET"

    children = traced.children_of(req)
    assert [(c.name, c.start_ns - t0, c.end_ns - t0) for c in children] == [
        ("queue", 0, 10 * MS), ("prefill", 10 * MS, 50 * MS), ("decode", 50 * MS, 200 * MS)]
    assert all(c.trace_id == trace_id for c in children)


def test_no_traceparent_makes_a_root_and_unscheduled_request_has_only_queue(traced):
    t0 = time.time_ns()
    record_request_spans(None, "req-aborted", {"queued_ns": t0, "finished_ns": t0 + 5 * MS},
                         finish_reason="abort", error="client went away")
    flush_tracing()
    (req,) = traced.wait_for_spans("llm_request")
    assert req.parent_span_id is None
    assert req.status_code == "ERROR" and req.status_message == "client went away"
    assert [(c.name, c.start_ns, c.end_ns) for c in traced.children_of(req)] == [("queue", t0, t0 + 5 * MS)]
    assert sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN not in req.attributes


def test_request_without_first_token_has_prefill_to_the_end(traced):
    tp, _, gw = _gateway_traceparent()
    t0 = time.time_ns()
    record_request_spans(tp, "r", RequestTimeline(queued_ns=t0, scheduled_ns=t0 + MS, finished_ns=t0 + 3 * MS))
    flush_tracing()
    (req,) = traced.wait_for_spans("llm_request")
    assert req.parent_span_id == gw
    assert [(c.name, c.start_ns - t0, c.end_ns - t0) for c in traced.children_of(req)] == [
        ("queue", 0, MS), ("prefill", MS, 3 * MS)]


def test_invalid_traceparent_falls_back_to_root(traced):
    t0 = time.time_ns()
    record_request_spans("not-a-traceparent", "r", RequestTimeline(queued_ns=t0, finished_ns=t0 + MS))
    flush_tracing()
    (req,) = traced.wait_for_spans("llm_request")
    assert req.parent_span_id is None


def test_nothing_is_built_when_tracing_exports_nowhere(receiver):
    setup_tracing()
    t0 = time.time_ns()
    assert record_request_spans(None, "r", RequestTimeline(queued_ns=t0, finished_ns=t0 + MS)) is None
    flush_tracing()
    assert receiver.spans == []
