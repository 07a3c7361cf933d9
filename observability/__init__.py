"""kvserve.observability: tracing, structured logs and metrics (a leaf package).

Its modules import one another one way only (tests/contract checks there is no cycle):
semconv and metrics_catalogue import nothing of the package; tracing builds on
neither; request_spans and logging build on tracing; metrics_backend and metrics_gateway
on the catalogue.
"""

from __future__ import annotations

from . import semconv
from .tracing import (
    current_traceparent,
    extract_context,
    flush_tracing,
    get_tracer,
    inject_traceparent,
    setup_tracing,
    shutdown_tracing,
    span_context_from_traceparent,
    tracing_enabled,
)
from .logging import (
    configure_logging,
    get_logger,
    log_requests_enabled,
    logging_configured,
    request_context,
    request_text,
    request_text_fields,
)
from .request_spans import RequestTimeline, record_request_spans
from .metrics_catalogue import BACKEND_METRICS, CATALOGUE, GATEWAY_METRICS, MetricKind, MetricSpec
from .metrics_backend import BackendMetrics
from .metrics_gateway import GatewayMetrics

__all__ = [
    "BACKEND_METRICS", "CATALOGUE", "GATEWAY_METRICS", "BackendMetrics", "GatewayMetrics", "MetricKind",
    "MetricSpec", "RequestTimeline", "configure_logging", "current_traceparent", "extract_context",
    "flush_tracing", "get_logger", "get_tracer", "inject_traceparent", "log_requests_enabled", "logging_configured",
    "record_request_spans", "request_context", "request_text", "request_text_fields", "semconv",
    "setup_tracing", "shutdown_tracing", "span_context_from_traceparent", "tracing_enabled",
]
