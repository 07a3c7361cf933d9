"""Spans of one finished request, recorded after the fact from timestamps.

The engine thread never holds a span open: it notes wall-clock timestamps
(``time.time_ns()``) as a request moves through the scheduler, and when the
request finishes it calls ``record_request_spans`` once. The spans come out
as if they had been live::

    <remote parent: the gateway's span, from the traceparent>
    └── llm_request  [queued ........................................ finished]
        ├── queue    [queued .. scheduled]
        ├── prefill             [scheduled .. first_token]
        └── decode                            [first_token ........... finished]
        events on llm_request: queued, scheduled, first_token, preempted (each), finished

A request that never got scheduled (aborted while waiting) has only "queue"
(up to finished); one that never produced a token has no "decode".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import semconv as sc
from . import tracing

SPAN_REQUEST = "llm_request"
SPAN_QUEUE = "queue"
SPAN_PREFILL = "prefill"
SPAN_DECODE = "decode"


@dataclass(slots=True)
class RequestTimeline:
    """Wall-clock instants (ns since the epoch, ``time.time_ns()``) of one request."""

    queued_ns: int
    finished_ns: int
    scheduled_ns: int | None = None  # first time the scheduler ran it
    first_token_ns: int | None = None
    preempted_ns: Sequence[int] = ()

    @classmethod
    def coerce(cls, value: RequestTimeline | Mapping[str, Any]) -> RequestTimeline:
        if isinstance(value, cls):
            return value
        return cls(**dict(value))


def _seconds(start_ns: int | None, end_ns: int | None) -> float | None:
    if start_ns is None or end_ns is None:
        return None
    return max(0, end_ns - start_ns) / 1e9


def _child(tracer: trace.Tracer, parent_ctx: otel_context.Context, name: str, start_ns: int, end_ns: int) -> None:
    span = tracer.start_span(name, context=parent_ctx, kind=SpanKind.INTERNAL, start_time=start_ns)
    span.end(end_time=max(start_ns, end_ns))


def record_request_spans(traceparent: str | None, request_id: str,
                         timestamps: RequestTimeline | Mapping[str, Any],
                         attributes: Mapping[str, Any] | None = None, *,
                         finish_reason: str | None = None,
                         error: str | None = None) -> trace.SpanContext | None:
    """Emit the span tree above for a finished request; thread-safe, non-blocking.

    traceparent: W3C header value from the Triton request parameters; None or
    invalid makes ``llm_request`` a new root. attributes: extra ``gen_ai.*``
    attributes (token counts, sampling params); None values are dropped, and
    they override the latencies computed here. error: sets the span status to
    ERROR with this message. Returns the SpanContext of ``llm_request``, or
    None when tracing exports nowhere (then nothing is built at all).
    """
    if not tracing.tracing_enabled():
        return None
    tl = RequestTimeline.coerce(timestamps)
    tracer = tracing.get_tracer()
    parent = tracing.extract_context({tracing.TRACEPARENT: traceparent} if traceparent else None)

    attrs: dict[str, Any] = {
        sc.GEN_AI_SYSTEM: sc.GEN_AI_SYSTEM_VALUE,
        sc.GEN_AI_REQUEST_ID: request_id,
        sc.GEN_AI_LATENCY_TIME_IN_QUEUE: _seconds(tl.queued_ns, tl.scheduled_ns),
        sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: _seconds(tl.queued_ns, tl.first_token_ns),
        sc.GEN_AI_LATENCY_E2E: _seconds(tl.queued_ns, tl.finished_ns),
        sc.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: _seconds(tl.scheduled_ns, tl.first_token_ns),
        sc.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: _seconds(tl.first_token_ns, tl.finished_ns),
        sc.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE: _seconds(tl.scheduled_ns, tl.finished_ns),
        sc.KVSERVE_NUM_PREEMPTIONS: len(tl.preempted_ns),
    }
    if finish_reason is not None:
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [finish_reason]
    attrs.update(attributes or {})
    attrs = {k: v for k, v in attrs.items() if v is not None}

    span = tracer.start_span(SPAN_REQUEST, context=parent, kind=SpanKind.SERVER,
                             attributes=attrs, start_time=tl.queued_ns)
    span.add_event("queued", timestamp=tl.queued_ns)
    if tl.scheduled_ns is not None:
        span.add_event("scheduled", timestamp=tl.scheduled_ns)
    if tl.first_token_ns is not None:
        span.add_event("first_token", timestamp=tl.first_token_ns)
    for i, ts in enumerate(tl.preempted_ns):
        span.add_event("preempted", attributes={"kvserve.preemption_index": i}, timestamp=ts)
    span.add_event("finished", attributes={"finish_reason": finish_reason} if finish_reason else None,
                   timestamp=tl.finished_ns)

    ctx = trace.set_span_in_context(span, otel_context.Context())
    if tl.scheduled_ns is None:
        _child(tracer, ctx, SPAN_QUEUE, tl.queued_ns, tl.finished_ns)
    else:
        _child(tracer, ctx, SPAN_QUEUE, tl.queued_ns, tl.scheduled_ns)
        _child(tracer, ctx, SPAN_PREFILL, tl.scheduled_ns,
               tl.first_token_ns if tl.first_token_ns is not None else tl.finished_ns)
        if tl.first_token_ns is not None:
            _child(tracer, ctx, SPAN_DECODE, tl.first_token_ns, tl.finished_ns)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=max(tl.queued_ns, tl.finished_ns))
    return span.get_span_context()
