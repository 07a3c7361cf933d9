"""Where tracing plugs into the gateway, in one place: `start_server_span`
opens the SERVER span of an HTTP request (parented on the client's W3C
`traceparent`, if any) and `backend_traceparent` gives the traceparent that
goes into the Triton request parameters, so the backend's spans are children
of this one.

When tracing is not set up the tracer is a no-op; the client's traceparent is
then forwarded unchanged, so an outer trace still reaches the backend.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from kvserve.observability.tracing import extract_context, get_tracer, inject_traceparent

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


@dataclass(slots=True)
class ServerSpan:
    span: trace.Span
    incoming: str | None  # the client's traceparent, validated

    def annotate(self, attributes: dict[str, Any]) -> None:
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def set_status(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR))

    def end(self) -> None:
        self.span.end()


def start_server_span(request: web.Request, route: str) -> ServerSpan:
    header = request.headers.get("traceparent", "").strip().lower()
    incoming = header if _TRACEPARENT.match(header) else None
    carrier = {"traceparent": incoming} if incoming else {}
    if incoming and "tracestate" in request.headers:
        carrier["tracestate"] = request.headers["tracestate"][:512]
    span = get_tracer().start_span(
        f"{request.method} {route}",
        context=extract_context(carrier),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": request.method, "http.route": route, "url.path": request.path[:256]},
    )
    return ServerSpan(span=span, incoming=incoming)


def backend_traceparent(span: ServerSpan | None) -> str | None:
    """The `traceparent` request parameter for the Triton request."""
    if span is None:
        return None
    if span.span.get_span_context().is_valid:
        return inject_traceparent(ctx=trace.set_span_in_context(span.span)).get("traceparent")
    return span.incoming
