"""tritonserver's per-model series exist from the model's load, at 0 (rate() and absent() work
before the first request), and only successful requests move the count and duration counters."""
from __future__ import annotations

from kvserve.backend.host.host_metrics import FAILURE_REASONS, HostMetrics, MetricStore


def _samples(store: MetricStore) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in store.collect() for s in m.samples}


def test_series_exist_at_zero_once_a_model_is_loaded() -> None:
    store = MetricStore()
    metrics = HostMetrics(store)
    metrics.model_loaded("llm", "1")
    samples = _samples(store)
    labels = (("model", "llm"), ("version", "1"))
    for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count",
                 "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_pending_request_count"):
        assert samples[(name, labels)] == 0, name
    for reason in FAILURE_REASONS:
        assert samples[("nv_inference_request_failure", (("model", "llm"), ("reason", reason), ("version", "1")))] == 0


def test_a_failed_request_moves_only_the_failure_counter() -> None:
    store = MetricStore()
    metrics = HostMetrics(store)
    metrics.request_done("llm", "1", "CANCELED", duration_us=5_000_000, queue_us=10)
    metrics.request_done("llm", "1", None, duration_us=2_000, queue_us=30)
    samples = _samples(store)
    labels = (("model", "llm"), ("version", "1"))
    assert samples[("nv_inference_request_failure", (("model", "llm"), ("reason", "CANCELED"), ("version", "1")))] == 1
    assert samples[("nv_inference_request_success", labels)] == 1 and samples[("nv_inference_count", labels)] == 1
    assert samples[("nv_inference_request_duration_us", labels)] == 2_000
    assert samples[("nv_inference_queue_duration_us", labels)] == 30


def test_a_model_unloaded_and_loaded_again_starts_its_series_afresh() -> None:
    store = MetricStore()
    metrics = HostMetrics(store)
    metrics.model_loaded("llm", "1")
    metrics.model_loaded("other", "1")
    metrics.request_done("llm", "1", None, duration_us=100, queue_us=1)
    metrics.request_done("llm", "1", "BACKEND", duration_us=100, queue_us=1)
    metrics.model_unloaded("llm", "1")
    samples = _samples(store)
    assert not [key for key in samples if ("model", "llm") in key[1]]  # every series of the model, failures too
    assert samples[("nv_inference_request_success", (("model", "other"), ("version", "1")))] == 0
    metrics.model_loaded("llm", "1")  # registering again does not raise...
    metrics.model_loaded("llm", "1")
    samples = _samples(store)
    labels = (("model", "llm"), ("version", "1"))
    assert samples[("nv_inference_request_success", labels)] == 0  # ...and counts from 0
    assert samples[("nv_inference_request_failure", (("model", "llm"), ("reason", "BACKEND"), ("version", "1")))] == 0
