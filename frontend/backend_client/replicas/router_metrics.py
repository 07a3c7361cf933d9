"""The router's Prometheus metrics: what it decided and what it sees.

Own registry (not the gateway's), rendered in front of the replicas' merged
metrics by `ReplicaSet.metrics_text()`, so the gateway's `/metrics` handler
needs no change to show them.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from kvserve.frontend.backend_client.replicas.routing import DECISIONS
from kvserve.observability import metrics_catalogue as m
from kvserve.observability.metrics_gateway import prometheus_metrics


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        metrics = prometheus_metrics(m.ROUTER_METRICS, self.registry)
        self._requests = metrics[m.ROUTER_REQUESTS.name]
        self._outstanding = metrics[m.ROUTER_OUTSTANDING.name]
        self._ready = metrics[m.ROUTER_REPLICA_READY.name]

    def add_replica(self, name: str) -> None:
        # Every series exists from the start, so rate() and dashboards work at once.
        for decision in DECISIONS:
            self._requests.labels(replica=name, decision=decision)
        self._outstanding.labels(replica=name).set(0)
        self._ready.labels(replica=name).set(0)

    def remove_replica(self, name: str) -> None:
        for decision in DECISIONS:
            _remove(self._requests, name, decision)
        _remove(self._outstanding, name)
        _remove(self._ready, name)

    def routed(self, name: str, decision: str) -> None:
        self._requests.labels(replica=name, decision=decision).inc()

    def set_outstanding(self, name: str, value: int) -> None:
        self._outstanding.labels(replica=name).set(value)

    def set_ready(self, name: str, ready: bool) -> None:
        self._ready.labels(replica=name).set(1 if ready else 0)

    def render(self) -> str:
        return generate_latest(self.registry).decode("utf-8")


def _remove(metric, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass
