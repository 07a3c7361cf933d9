"""kvserve.observability: tracing, structured logs and metrics (a leaf package).

Import order matters: tracing and metrics re-export their satellite modules
(request_spans, metrics_backend, metrics_gateway), which import them back.
"""

from __future__ import annotations

from . import semconv
from .tracing import (
    RequestTimeline,
    current_traceparent,
    extract_context,
    flush_tracing,
    get_tracer,
    inject_traceparent,
    record_request_spans,
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
from .metrics import BACKEND_METRICS, CATALOGUE, GATEWAY_METRICS, BackendMetrics, GatewayMetrics, MetricKind, MetricSpec

__all__ = [
    "BACKEND_METRICS", "CATALOGUE", "GATEWAY_METRICS", "BackendMetrics", "GatewayMetrics", "MetricKind",
    "MetricSpec", "RequestTimeline", "configure_logging", "current_traceparent", "extract_context",
    "flush_tracing", "get_logger", "get_tracer", "inject_traceparent", "log_requests_enabled", "logging_configured",
    "record_request_spans", "request_context", "request_text", "request_text_fields", "semconv",
    "setup_tracing", "shutdown_tracing", "span_context_from_traceparent", "tracing_enabled",
]
