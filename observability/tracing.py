"""OpenTelemetry tracer setup from the standard ``OTEL_*`` environment, and
W3C ``traceparent`` propagation through plain string dicts.

Exporter selection (``setup_tracing``):

* ``OTEL_TRACES_EXPORTER`` -- comma list of ``otlp``, ``console``, ``none``.
  Unset means ``otlp`` if an OTLP endpoint is configured (argument,
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``),
  else ``none``. The explicit ``otlp_traces_endpoint`` argument (the
  ``--otlp-traces-endpoint`` flag) always adds ``otlp``, as in vLLM.
* ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` --
  ``grpc`` (default, like the Python SDK and vLLM) or ``http/protobuf``.
* Endpoints, headers, timeouts, compression, ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER(_ARG)``, ``OTEL_BSP_*``
  are read by the SDK itself; we only pass the endpoint when it is given
  explicitly. An explicit endpoint without a scheme gets ``http://``; an
  explicit http/protobuf endpoint without a path gets ``/v1/traces`` appended
  (the SDK takes an explicit URL verbatim).

The process-wide provider is registered with OpenTelemetry exactly once; it
delegates to the SDK provider of the current configuration. That lets a later
``setup_tracing`` with different settings (a test pointing at a new receiver)
take effect everywhere, including in tracers obtained earlier, which a plain
``trace.set_tracer_provider`` forbids.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_log = logging.getLogger(__name__)

TRACER_NAME = "kvserve"
DEFAULT_SERVICE_NAME = "kvserve"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_PROTOCOLS = ("grpc", "http/protobuf")

_W3C = TraceContextTextMapPropagator()
_lock = threading.Lock()
_sdk_provider: SdkTracerProvider | None = None
_config_key: tuple | None = None
_exporter_names: tuple[str, ...] = ()
_atexit_registered = False


class _SwitchableTracer(trace.Tracer):
    """Resolves the current SDK provider on every call (see module doc)."""

    def __init__(self, args: tuple) -> None:
        self._args = args
        self._cached: tuple[SdkTracerProvider | None, trace.Tracer] | None = None

    def _real(self) -> trace.Tracer:
        provider = _sdk_provider
        cached = self._cached
        if cached is not None and cached[0] is provider:
            return cached[1]
        real = provider.get_tracer(*self._args) if provider is not None else trace.NoOpTracer()
        self._cached = (provider, real)
        return real

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._real().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        return self._real().start_as_current_span(*args, **kwargs)


class _SwitchableTracerProvider(trace.TracerProvider):
    def get_tracer(self, instrumenting_module_name: str, instrumenting_library_version: str | None = None,
                   schema_url: str | None = None, attributes: Any = None) -> trace.Tracer:
        return _SwitchableTracer((instrumenting_module_name, instrumenting_library_version,
                                  schema_url, attributes))


_global_provider = _SwitchableTracerProvider()


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _select_exporters(otlp_traces_endpoint: str | None) -> tuple[str, ...]:
    raw = _env("OTEL_TRACES_EXPORTER")
    if raw is None:
        has_endpoint = bool(_env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_ENDPOINT"))
        names = ["otlp"] if has_endpoint else []
    else:
        names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    if otlp_traces_endpoint:
        names.append("otlp")
    selected: list[str] = []
    for name in names:
        if name == "none":
            continue
        if name not in ("otlp", "console"):
            _log.warning("OTEL_TRACES_EXPORTER=%s: exporter %r is not supported; ignored", raw, name)
            continue
        if name not in selected:
            selected.append(name)
    return tuple(selected)


def _otlp_protocol() -> str:
    for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = _env(var)
        if value is not None:
            if value not in _PROTOCOLS:
                raise ValueError(f"{var}={value!r} is not supported; use one of {', '.join(_PROTOCOLS)}")
            return value
    return "grpc"


def _http_traces_url(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def _make_exporter(name: str, protocol: str, endpoint: str | None) -> SpanExporter:
    if name == "console":
        # Bound now, not at import: the SDK's default binds the stdout that
        # existed when it was imported, which bypasses later redirection.
        return ConsoleSpanExporter(out=sys.stdout)
    if endpoint and "://" not in endpoint:
        # "host:4317" would otherwise parse as scheme "host" and make the gRPC
        # exporter try TLS against a plaintext collector, failing silently.
        endpoint = "http://" + endpoint
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint) if endpoint else GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=_http_traces_url(endpoint)) if endpoint else HttpExporter()


def _make_resource(service_name: str) -> Resource:
    resource = Resource.create({})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    return resource


def setup_tracing(otlp_traces_endpoint: str | None = None, *,
                  service_name: str = DEFAULT_SERVICE_NAME) -> bool:
    """Configure tracing from the environment; return True if spans are exported.

    Idempotent: calling again with the same arguments and environment does
    nothing; a changed configuration flushes and replaces the previous one.
    With no exporter a recording provider is still installed, so spans (and
    the trace ids in log lines) exist even when nothing is sent anywhere.
    Raises ValueError for an unsupported OTLP protocol.
    """
    global _sdk_provider, _config_key, _exporter_names, _atexit_registered
    exporters = _select_exporters(otlp_traces_endpoint)
    protocol = _otlp_protocol() if "otlp" in exporters else None
    env_snapshot = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("OTEL_")))
    key = (exporters, protocol, otlp_traces_endpoint, service_name, env_snapshot)
    with _lock:
        if key == _config_key and _sdk_provider is not None:
            return bool(_exporter_names)
        provider = SdkTracerProvider(resource=_make_resource(service_name), shutdown_on_exit=False)
        for name in exporters:
            provider.add_span_processor(BatchSpanProcessor(_make_exporter(name, protocol or "", otlp_traces_endpoint)))
        old, _sdk_provider = _sdk_provider, provider
        _config_key, _exporter_names = key, exporters
        if not _atexit_registered:
            atexit.register(shutdown_tracing)
            _atexit_registered = True
            trace.set_tracer_provider(_global_provider)
            if trace.get_tracer_provider() is not _global_provider:
                _log.warning("a global TracerProvider was already set; use kvserve.observability.get_tracer()")
    if old is not None:
        old.shutdown()  # flushes what the previous exporters still hold
    return bool(exporters)


def tracing_enabled() -> bool:
    """True if the current configuration exports spans somewhere."""
    return _sdk_provider is not None and bool(_exporter_names)


def get_tracer(name: str = TRACER_NAME) -> trace.Tracer:
    """A tracer that follows the current configuration (no-op before setup)."""
    return _global_provider.get_tracer(name)


def flush_tracing(timeout_s: float = 5.0) -> bool:
    """Export everything buffered so far; False if the timeout was hit."""
    provider = _sdk_provider
    return provider.force_flush(int(timeout_s * 1000)) if provider is not None else True


def shutdown_tracing() -> None:
    """Flush and stop the exporters; later spans are no-ops until setup again."""
    global _sdk_provider, _config_key, _exporter_names
    with _lock:
        provider, _sdk_provider = _sdk_provider, None
        _config_key, _exporter_names = None, ()
    if provider is not None:
        provider.shutdown()


# --- W3C trace context through Triton request parameters (str -> str) ---

def inject_traceparent(carrier: MutableMapping[str, str] | None = None,
                       ctx: otel_context.Context | None = None) -> dict[str, str] | MutableMapping[str, str]:
    """Write ``traceparent`` (and ``tracestate``) of the current span into carrier.

    Returns the carrier (a new dict if none is given); nothing is written when
    there is no valid current span.
    """
    if carrier is None:
        carrier = {}
    _W3C.inject(carrier, context=ctx)
    return carrier


def extract_context(carrier: Mapping[str, Any] | None) -> otel_context.Context:
    """OTel Context whose parent is the remote span in carrier (empty if none).

    Use it as ``tracer.start_as_current_span(name, context=ctx)``.
    Non-string values (Triton parameters may be bool/int) are ignored.
    """
    if not carrier:
        return otel_context.Context()
    strings = {k.lower(): v for k, v in carrier.items() if isinstance(v, str)}
    return _W3C.extract(strings, context=otel_context.Context())


def span_context_from_traceparent(traceparent: str | None) -> trace.SpanContext | None:
    """The remote SpanContext a traceparent names, or None if absent/invalid."""
    if not traceparent:
        return None
    span_ctx = trace.get_current_span(extract_context({TRACEPARENT: traceparent})).get_span_context()
    return span_ctx if span_ctx.is_valid else None


def current_traceparent() -> str | None:
    """The traceparent string of the current span, or None."""
    return inject_traceparent().get(TRACEPARENT)


def format_trace_id(trace_id: int) -> str:
    return format(trace_id, "032x")


def format_span_id(span_id: int) -> str:
    return format(span_id, "016x")
