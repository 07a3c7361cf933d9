"""Gateway metrics on a ``prometheus_client`` registry.

Each ``GatewayMetrics`` owns its registry (not the process-global default) so
that two gateways, or two tests, in one process never collide. The gateway's
``/metrics`` handler serves ``render()`` and then appends its backends' text.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

from . import metrics_catalogue as m


CONTENT_TYPE = CONTENT_TYPE_LATEST


def prometheus_metrics(specs: Iterable[m.MetricSpec], registry: CollectorRegistry,
                       extra_labels: tuple[str, ...] = ()) -> dict[str, Any]:
    """Declare specs on registry; returns {catalogue name: prometheus metric}."""
    out: dict[str, Any] = {}
    for spec in specs:
        labelnames = (*extra_labels, *spec.labels)
        if spec.kind is m.MetricKind.COUNTER:
            metric: Any = Counter(spec.name, spec.description, labelnames, registry=registry)
        elif spec.kind is m.MetricKind.GAUGE:
            metric = Gauge(spec.name, spec.description, labelnames, registry=registry)
        else:
            metric = Histogram(spec.name, spec.description, labelnames, registry=registry,
                               buckets=spec.buckets)
        out[spec.name] = metric
    return out


class GatewayMetrics:
    """HTTP metrics of the gateway. route must be the route template
    (``/v1/chat/completions``), never the raw path, to bound cardinality."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # No `*_created` sample beside every counter and histogram (prometheus_client's default:
        # a gauge family per metric that nobody graphs; vLLM turns it off too). Process-wide, so
        # only a process that serves the gateway's /metrics does it.
        disable_created_metrics()
        self.registry = registry if registry is not None else CollectorRegistry()
        metrics = prometheus_metrics(m.GATEWAY_METRICS, self.registry)
        self._requests = metrics[m.HTTP_REQUESTS.name]
        self._duration = metrics[m.HTTP_REQUEST_DURATION.name]
        self._streams = metrics[m.HTTP_STREAMS_IN_FLIGHT.name]

    def observe_request(self, route: str, status: int, duration_s: float) -> None:
        self._requests.labels(route=route, status=str(status)).inc()
        self._duration.labels(route=route).observe(max(0.0, duration_s))

    def stream_started(self) -> None:
        self._streams.inc()

    def stream_finished(self) -> None:
        self._streams.dec()

    @contextmanager
    def track_stream(self) -> Iterator[None]:
        """Count an open SSE stream for the duration of the block."""
        self.stream_started()
        try:
            yield
        finally:
            self.stream_finished()

    def render(self) -> bytes:
        """Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
