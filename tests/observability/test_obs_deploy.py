"""deploy/ configs: valid YAML, and every pipeline component is declared."""

from __future__ import annotations

from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_otel_collector_pipeline_is_wired():
    cfg = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text())
    traces = cfg["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"]
    assert set(cfg["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    assert "batch" in traces["processors"]
    assert {"debug", "otlp/jaeger"} <= set(traces["exporters"])
    for section in ("receivers", "processors", "exporters"):
        assert set(traces[section]) <= set(cfg[section]), section


def test_prometheus_scrapes_backend_and_gateway():
    cfg = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {t for job in cfg["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    # Every tritonserver replica's metrics port (8002) and the gateway.
    assert "gateway:8000" in targets
    assert any(t.endswith(":8002") for t in targets)
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in cfg["scrape_configs"])
