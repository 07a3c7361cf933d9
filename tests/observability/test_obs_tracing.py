"""setup_tracing: exporter choice from OTEL_* env vars, and traceparent propagation."""

from __future__ import annotations

import json
import re

import pytest
from opentelemetry import trace

from kvserve.observability import (
    current_traceparent,
    extract_context,
    flush_tracing,
    get_tracer,
    inject_traceparent,
    setup_tracing,
    span_context_from_traceparent,
    tracing_enabled,
)
from kvserve.observability import semconv as sc
from kvserve.observability import tracing
from tests.utils.otlp_receiver import OTLPReceiver


def _emit_parent_and_child() -> tuple[trace.SpanContext, trace.SpanContext, dict[str, str]]:
    tracer = get_tracer()
    with tracer.start_as_current_span("gateway", kind=trace.SpanKind.SERVER,
                                      attributes={sc.GEN_AI_REQUEST_MODEL: "tiny", sc.GEN_AI_REQUEST_MAX_TOKENS: 16}
                                      ) as parent:
        carrier = inject_traceparent()
        with tracer.start_as_current_span("child", attributes={"k": "v"}) as child:
            pass
    assert flush_tracing()
    return parent.get_span_context(), child.get_span_context(), carrier


def _assert_parent_child_arrived(rx: OTLPReceiver, parent_ctx, child_ctx) -> None:
    (parent,) = rx.wait_for_spans(name="gateway")
    (child,) = rx.wait_for_spans(name="child")
    assert parent.trace_id == child.trace_id == format(parent_ctx.trace_id, "032x")
    assert parent.span_id == format(parent_ctx.span_id, "016x")
    assert child.span_id == format(child_ctx.span_id, "016x")
    assert child.parent_span_id == parent.span_id
    assert parent.parent_span_id is None
    assert parent.kind == "SERVER"
    assert parent.attributes == {sc.GEN_AI_REQUEST_MODEL: "tiny", sc.GEN_AI_REQUEST_MAX_TOKENS: 16}
    assert child.attributes == {"k": "v"}
    assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns


def test_otlp_http_from_traces_endpoint_env(receiver, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.traces_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "kvserve-under-test")
    assert setup_tracing() is True  # an endpoint alone selects otlp
    parent_ctx, child_ctx, _ = _emit_parent_and_child()
    _assert_parent_child_arrived(receiver, parent_ctx, child_ctx)
    assert receiver.spans[0].resource["service.name"] == "kvserve-under-test"


def test_otlp_http_from_base_endpoint_env_with_explicit_exporter(receiver, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)  # SDK appends /v1/traces
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert setup_tracing() is True
    parent_ctx, child_ctx, _ = _emit_parent_and_child()
    _assert_parent_child_arrived(receiver, parent_ctx, child_ctx)
    assert receiver.spans[0].resource["service.name"] == "kvserve"  # our default name


def test_explicit_endpoint_argument_http_appends_signal_path(receiver, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert setup_tracing(otlp_traces_endpoint=receiver.endpoint) is True
    parent_ctx, child_ctx, _ = _emit_parent_and_child()
    _assert_parent_child_arrived(receiver, parent_ctx, child_ctx)


def test_otlp_grpc_is_the_default_protocol():
    with OTLPReceiver(protocol="grpc") as rx:
        # Schemeless, as users type it: must mean plaintext, not TLS.
        assert setup_tracing(otlp_traces_endpoint=f"{rx.host}:{rx.port}") is True
        parent_ctx, child_ctx, _ = _emit_parent_and_child()
        _assert_parent_child_arrived(rx, parent_ctx, child_ctx)


def test_console_exporter_prints_spans(capsys, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert setup_tracing() is True
    with get_tracer().start_as_current_span("to-the-console"):
        pass
    assert flush_tracing()
    out = capsys.readouterr().out
    assert '"name": "to-the-console"' in out


def test_none_by_default_but_spans_still_carry_ids(receiver):
    assert setup_tracing() is False
    assert not tracing_enabled()
    with get_tracer().start_as_current_span("local") as span:
        assert span.get_span_context().is_valid  # log lines still get a trace_id
    flush_tracing()
    assert receiver.spans == []


def test_exporter_none_wins_over_endpoint_env(receiver, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.traces_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    assert setup_tracing() is False
    with get_tracer().start_as_current_span("dropped"):
        pass
    flush_tracing()
    assert receiver.export_requests == 0


def test_sampler_env_is_honoured(receiver, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    setup_tracing(otlp_traces_endpoint=receiver.endpoint)
    with get_tracer().start_as_current_span("unsampled") as span:
        assert not span.is_recording()
    flush_tracing()
    assert receiver.spans == []


def test_unsupported_protocol_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        setup_tracing()


def test_setup_is_idempotent_and_reconfigurable(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    early_tracer = get_tracer("obtained-before-setup")
    with OTLPReceiver() as first, OTLPReceiver() as second:
        setup_tracing(otlp_traces_endpoint=first.endpoint)
        provider = tracing._sdk_provider
        setup_tracing(otlp_traces_endpoint=first.endpoint)
        assert tracing._sdk_provider is provider  # same config: nothing rebuilt
        with early_tracer.start_as_current_span("one"):
            pass
        setup_tracing(otlp_traces_endpoint=second.endpoint)  # flushes the first
        assert tracing._sdk_provider is not provider
        with early_tracer.start_as_current_span("two"):
            pass
        flush_tracing()
        assert [s.name for s in first.wait_for_spans("one")] == ["one"]
        assert [s.name for s in second.wait_for_spans("two")] == ["two"]
        assert first.find("two") == [] and second.find("one") == []
        assert trace.get_tracer_provider() is tracing._global_provider


def test_traceparent_round_trip():
    setup_tracing()
    assert current_traceparent() is None  # no span, nothing to propagate
    tracer = get_tracer()
    with tracer.start_as_current_span("gateway") as gw:
        params = inject_traceparent({"max_tokens": "16"})
        assert current_traceparent() == params["traceparent"]
    ctx = gw.get_span_context()
    assert params["max_tokens"] == "16"
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", params["traceparent"])
    assert params["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    assert int(params["traceparent"][-2:], 16) & 1  # sampled flag (0x02 "random" may be set too)

    # The backend side: Triton parameters may hold non-strings; keys may differ in case.
    remote = extract_context({"Traceparent": params["traceparent"], "stream": True, "n": 1})
    with tracer.start_as_current_span("backend", context=remote) as child:
        pass
    assert child.parent.span_id == ctx.span_id and child.parent.is_remote
    assert child.get_span_context().trace_id == ctx.trace_id

    parsed = span_context_from_traceparent(params["traceparent"])
    assert (parsed.trace_id, parsed.span_id) == (ctx.trace_id, ctx.span_id)
    assert span_context_from_traceparent("00-garbage") is None
    assert span_context_from_traceparent(None) is None
    assert not trace.get_current_span(extract_context({})).get_span_context().is_valid


def test_console_span_json_is_valid(capsys, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console,none")
    setup_tracing()
    with get_tracer().start_as_current_span("json-check", attributes={sc.GEN_AI_OPERATION_NAME: "chat"}):
        pass
    flush_tracing()
    record = json.loads(capsys.readouterr().out)
    assert record["name"] == "json-check"
    assert record["attributes"][sc.GEN_AI_OPERATION_NAME] == "chat"
