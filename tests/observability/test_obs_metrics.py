"""The metric catalogue through a fake pb_utils and through prometheus_client."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from kvserve.observability import metrics_catalogue as m
from kvserve.observability.metrics_backend import BackendMetrics
from kvserve.observability.metrics_gateway import GatewayMetrics, prometheus_metrics

# The list in DESIGN.md "Observability", plus the gateway metrics.
DESIGN_NAMES = {
    "kvserve:num_requests_running": m.MetricKind.GAUGE,
    "kvserve:num_grammar_matchers": m.MetricKind.GAUGE,  # structured outputs (issue 18)
    "kvserve:num_requests_waiting": m.MetricKind.GAUGE,
    "kvserve:kv_cache_usage_perc": m.MetricKind.GAUGE,
    "kvserve:kv_cache_touched_bytes": m.MetricKind.GAUGE,  # the CPU cache's resident part (soak)
    "kvserve:prompt_tokens_total": m.MetricKind.COUNTER,
    "kvserve:generation_tokens_total": m.MetricKind.COUNTER,
    "kvserve:request_success_total": m.MetricKind.COUNTER,
    "kvserve:num_preemptions_total": m.MetricKind.COUNTER,
    "kvserve:prefix_cache_queries_total": m.MetricKind.COUNTER,
    "kvserve:prefix_cache_hits_total": m.MetricKind.COUNTER,
    "kvserve:time_to_first_token_seconds": m.MetricKind.HISTOGRAM,
    "kvserve:inter_token_latency_seconds": m.MetricKind.HISTOGRAM,
    "kvserve:e2e_request_latency_seconds": m.MetricKind.HISTOGRAM,
    "kvserve:request_queue_time_seconds": m.MetricKind.HISTOGRAM,
    # vLLM's per-request phases and sizes
    "kvserve:request_prefill_time_seconds": m.MetricKind.HISTOGRAM,
    "kvserve:request_decode_time_seconds": m.MetricKind.HISTOGRAM,
    "kvserve:request_inference_time_seconds": m.MetricKind.HISTOGRAM,
    "kvserve:request_prompt_tokens": m.MetricKind.HISTOGRAM,
    "kvserve:request_generation_tokens": m.MetricKind.HISTOGRAM,
    "kvserve:iteration_tokens_total": m.MetricKind.HISTOGRAM,  # vLLM's name
    # vLLM's request parameters, per-request decode speed and cache_config_info
    "kvserve:request_params_n": m.MetricKind.HISTOGRAM,
    "kvserve:request_params_max_tokens": m.MetricKind.HISTOGRAM,
    "kvserve:request_max_num_generation_tokens": m.MetricKind.HISTOGRAM,
    "kvserve:request_time_per_output_token_seconds": m.MetricKind.HISTOGRAM,
    "kvserve:cache_config_info": m.MetricKind.GAUGE,
    # speculative decoding (issue 32): vLLM's spec_decode counters
    "kvserve:spec_decode_num_drafts_total": m.MetricKind.COUNTER,
    "kvserve:spec_decode_num_draft_tokens_total": m.MetricKind.COUNTER,
    "kvserve:spec_decode_num_accepted_tokens_total": m.MetricKind.COUNTER,
    "kvserve:spec_decode_proposer_errors_total": m.MetricKind.COUNTER,
    "kvserve:lora_requests_info": m.MetricKind.GAUGE,  # issue 33: vLLM's vllm:lora_requests_info
    "kvserve:lora_requests_total": m.MetricKind.COUNTER,
    "kvserve:spec_decode_num_accepted_tokens_per_pos_total": m.MetricKind.COUNTER,
    "kvserve:http_requests_total": m.MetricKind.COUNTER,
    "kvserve:http_request_duration_seconds": m.MetricKind.HISTOGRAM,
    "kvserve:http_streams_in_flight": m.MetricKind.GAUGE,
}


def make_fake_pb_utils(reject_colon: bool = False) -> SimpleNamespace:
    """A minimal stand-in for triton_python_backend_utils' metric API.

    It enforces what Triton enforces (kind-specific operations, buckets only
    for histograms, no negative counter increments) and its read-modify-write
    yields the GIL, so unsynchronised callers would lose updates.
    """
    families: dict[str, FakeFamily] = {}

    class FakeMetric:
        def __init__(self, family: FakeFamily, labels: dict, buckets: list | None) -> None:
            self.family, self.labels, self.buckets = family, labels, buckets
            self.value = 0.0
            self.observations: list[float] = []

        def _add(self, v: float) -> None:
            current = self.value
            time.sleep(0)
            self.value = current + v

        def increment(self, v: float) -> None:
            assert self.family.kind in (FakeFamily.COUNTER, FakeFamily.GAUGE)
            if self.family.kind == FakeFamily.COUNTER and v < 0:
                raise RuntimeError("counter cannot decrease")
            self._add(v)

        def set(self, v: float) -> None:
            assert self.family.kind == FakeFamily.GAUGE
            self.value = v

        def observe(self, v: float) -> None:
            assert self.family.kind == FakeFamily.HISTOGRAM
            self.observations.append(v)

    class FakeFamily:
        COUNTER, GAUGE, HISTOGRAM = 0, 1, 2

        def __init__(self, name: str, description: str, kind: int) -> None:
            if reject_colon and ":" in name:
                raise RuntimeError(f"invalid metric name {name}")
            assert kind in (0, 1, 2) and description
            self.name, self.description, self.kind = name, description, kind
            self.metrics: dict[tuple, FakeMetric] = {}
            families[name] = self

        def Metric(self, labels: dict, buckets: list | None = None) -> FakeMetric:  # noqa: N802 (Triton API)
            if (self.kind == FakeFamily.HISTOGRAM) != (buckets is not None):
                raise RuntimeError("buckets are for histograms only, and required there")
            key = tuple(sorted(labels.items()))
            assert key not in self.metrics, "same series declared twice"
            self.metrics[key] = metric = FakeMetric(self, labels, buckets)
            return metric

    return SimpleNamespace(MetricFamily=FakeFamily, families=families)


MODEL = {"model": "llm", "version": "1"}


def series(pb, name: str, **extra):
    return pb.families[name].metrics[tuple(sorted({**MODEL, **extra}.items()))]


def test_catalogue_matches_design():
    assert {s.name: s.kind for s in m.CATALOGUE} == DESIGN_NAMES
    assert len(m.SPECS_BY_NAME) == len(m.CATALOGUE)
    assert m.REQUEST_SUCCESS.labels == ("finished_reason",)
    assert m.HTTP_REQUESTS.labels == ("route", "status")
    assert m.TIME_TO_FIRST_TOKEN.buckets[0] == 0.001 and m.REQUEST_QUEUE_TIME.buckets[-1] == 7680.0
    with pytest.raises(ValueError):
        m.MetricSpec("kvserve:h", m.MetricKind.HISTOGRAM, "no buckets")
    with pytest.raises(ValueError):
        m.MetricSpec("bad-name", m.MetricKind.GAUGE, "dash")
    with pytest.raises(ValueError):
        m.MetricSpec("kvserve:h", m.MetricKind.HISTOGRAM, "unsorted", buckets=(1.0, 0.5))


def test_backend_metrics_through_pb_utils():
    pb = make_fake_pb_utils()
    rec = BackendMetrics(pb, MODEL)
    assert {n: f.kind for n, f in pb.families.items()} == {
        s.name: getattr(pb.MetricFamily, s.kind.name) for s in m.BACKEND_METRICS}
    assert rec.names == {s.name: s.name for s in m.BACKEND_METRICS}

    rec.on_step(running=3, waiting=2, kv_usage=0.25)
    rec.on_step(running=4, waiting=0, kv_usage=0.5, kv_touched_bytes=3 << 20)
    rec.on_prompt_tokens(100)
    rec.on_prompt_tokens(0)
    rec.on_generation_tokens(7)
    rec.on_generation_tokens(5)
    rec.on_preemptions(2)
    rec.on_spec_decode(drafts=3, draft_tokens=12, accepted_tokens=7, proposer_errors=1,
                       accepted_per_position=[3, 2, 2, 0])
    rec.on_spec_decode(drafts=0, draft_tokens=0, accepted_tokens=0, proposer_errors=0)
    rec.on_prefix_cache(queries=64, hits=48)
    rec.on_token_latency(0.02)
    rec.on_token_latency(0.03)
    rec.on_finished("stop", e2e_s=1.5, queue_s=0.1, ttft_s=0.2)
    rec.on_finished("length", e2e_s=3.0)
    rec.on_finished("cancelled_by_gremlins", e2e_s=0.5, queue_s=0.5)
    rec.on_request_phases(12, 7, prefill_s=0.1, decode_s=1.2, inference_s=1.3)
    rec.on_iteration_tokens(12)
    rec.on_iteration_tokens(1)
    rec.on_request_phases(40, 0, prefill_s=None, decode_s=None, inference_s=None)  # aborted while waiting
    rec.on_request_params(2, 16, 9, time_per_output_token_s=0.05)
    rec.on_request_params(1, 4, 1, time_per_output_token_s=None)  # one token: no time per output token
    rec.on_cache_config(16, "auto", True, 1024)

    assert series(pb, "kvserve:num_requests_running").value == 4
    assert series(pb, "kvserve:num_requests_waiting").value == 0
    assert series(pb, "kvserve:kv_cache_usage_perc").value == 0.5
    assert series(pb, "kvserve:kv_cache_touched_bytes").value == 3 << 20
    assert series(pb, "kvserve:prompt_tokens_total").value == 100
    assert series(pb, "kvserve:generation_tokens_total").value == 12
    assert series(pb, "kvserve:num_preemptions_total").value == 2
    assert series(pb, "kvserve:prefix_cache_queries_total").value == 64
    assert series(pb, "kvserve:prefix_cache_hits_total").value == 48
    assert series(pb, "kvserve:spec_decode_num_drafts_total").value == 3
    assert series(pb, "kvserve:spec_decode_num_draft_tokens_total").value == 12
    assert series(pb, "kvserve:spec_decode_num_accepted_tokens_total").value == 7
    assert series(pb, "kvserve:spec_decode_proposer_errors_total").value == 1
    per_pos = "kvserve:spec_decode_num_accepted_tokens_per_pos_total"
    assert [series(pb, per_pos, position=str(j)).value for j in range(3)] == [3, 2, 2]
    success = "kvserve:request_success_total"
    assert series(pb, success, finished_reason="stop").value == 1
    assert series(pb, success, finished_reason="length").value == 1
    assert series(pb, success, finished_reason="abort").value == 0  # pre-created at 0
    assert series(pb, success, finished_reason="cancelled_by_gremlins").value == 1
    e2e = series(pb, "kvserve:e2e_request_latency_seconds")
    assert e2e.observations == [1.5, 3.0, 0.5]
    assert e2e.buckets == list(m.REQUEST_LATENCY_BUCKETS)
    assert series(pb, "kvserve:request_queue_time_seconds").observations == [0.1, 0.5]
    ttft = series(pb, "kvserve:time_to_first_token_seconds")
    assert ttft.observations == [0.2] and ttft.buckets == list(m.TTFT_BUCKETS)
    assert series(pb, "kvserve:inter_token_latency_seconds").observations == [0.02, 0.03]
    prompt = series(pb, "kvserve:request_prompt_tokens")
    assert prompt.observations == [12, 40] and prompt.buckets == list(m.TOKEN_COUNT_BUCKETS)
    assert series(pb, "kvserve:request_generation_tokens").observations == [7, 0]
    assert series(pb, "kvserve:request_prefill_time_seconds").observations == [0.1]
    assert series(pb, "kvserve:request_decode_time_seconds").observations == [1.2]
    assert series(pb, "kvserve:request_inference_time_seconds").observations == [1.3]
    assert series(pb, "kvserve:request_params_n").observations == [2, 1]
    assert series(pb, "kvserve:request_params_n").buckets == list(m.REQUEST_N_BUCKETS)
    assert series(pb, "kvserve:request_params_max_tokens").observations == [16, 4]
    assert series(pb, "kvserve:request_max_num_generation_tokens").observations == [9, 1]
    assert series(pb, "kvserve:request_time_per_output_token_seconds").observations == [0.05]
    assert series(pb, "kvserve:cache_config_info", block_size="16", cache_dtype="auto", enable_prefix_caching="True",
                  num_gpu_blocks="1024").value == 1
    steps = series(pb, "kvserve:iteration_tokens_total")
    assert steps.observations == [12, 1] and steps.buckets == list(m.ITERATION_TOKEN_BUCKETS)


def test_backend_metrics_reject_nonsense():
    rec = BackendMetrics(make_fake_pb_utils(), MODEL)
    with pytest.raises(ValueError):
        rec.on_generation_tokens(-1)
    with pytest.raises(ValueError):
        rec.on_prefix_cache(queries=4, hits=5)
    with pytest.raises(ValueError):
        rec.on_spec_decode(drafts=1, draft_tokens=2, accepted_tokens=3, proposer_errors=0)


def test_colon_names_fall_back_when_rejected():
    pb = make_fake_pb_utils(reject_colon=True)
    rec = BackendMetrics(pb, MODEL)
    assert rec.names["kvserve:prompt_tokens_total"] == "kvserve_prompt_tokens_total"
    rec.on_prompt_tokens(9)
    assert pb.families["kvserve_prompt_tokens_total"].metrics[tuple(sorted(MODEL.items()))].value == 9
    assert not any(":" in name for name in pb.families)


def test_backend_metrics_are_thread_safe():
    pb = make_fake_pb_utils()
    rec = BackendMetrics(pb, MODEL)

    def work() -> None:
        for _ in range(200):
            rec.on_generation_tokens(1)
            rec.on_finished("stop", e2e_s=0.1)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert series(pb, "kvserve:generation_tokens_total").value == 1200
    assert series(pb, "kvserve:request_success_total", finished_reason="stop").value == 1200


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_gateway_metrics_on_prometheus_client():
    gw = GatewayMetrics()
    route = "/v1/chat/completions"
    gw.observe_request(route, 200, 0.3)
    gw.observe_request(route, 200, 0.3)
    gw.observe_request(route, 400, 0.01)
    gw.observe_request("/v1/models", 200, 0.002)
    with gw.track_stream():
        gw.stream_started()
        inflight = _samples(gw.render().decode())[("kvserve:http_streams_in_flight", ())]
        gw.stream_finished()
    assert inflight == 2

    text = gw.render().decode()
    assert 'kvserve:http_requests_total{route="/v1/chat/completions",status="200"} 2.0' in text
    s = _samples(text)
    assert s[("kvserve:http_requests_total", (("route", route), ("status", "400")))] == 1
    assert s[("kvserve:http_requests_total", (("route", "/v1/models"), ("status", "200")))] == 1
    dur = "kvserve:http_request_duration_seconds"
    assert s[(dur + "_count", (("route", route),))] == 3
    assert s[(dur + "_sum", (("route", route),))] == pytest.approx(0.61)
    assert s[(dur + "_bucket", (("le", "0.25"), ("route", route)))] == 1
    assert s[(dur + "_bucket", (("le", "0.5"), ("route", route)))] == 3
    assert s[(dur + "_bucket", (("le", "+Inf"), ("route", route)))] == 3
    assert s[("kvserve:http_streams_in_flight", ())] == 0
    assert gw.registry is not GatewayMetrics().registry  # own registry: no clashes


def test_backend_catalogue_renders_on_prometheus_client():
    registry = CollectorRegistry()
    metrics = prometheus_metrics(m.BACKEND_METRICS, registry, extra_labels=("model",))
    metrics["kvserve:prompt_tokens_total"].labels(model="llm").inc(5)
    metrics["kvserve:time_to_first_token_seconds"].labels(model="llm").observe(0.07)
    s = _samples(__import__("prometheus_client").generate_latest(registry).decode())
    assert s[("kvserve:prompt_tokens_total", (("model", "llm"),))] == 5
    assert s[("kvserve:time_to_first_token_seconds_bucket", (("le", "0.08"), ("model", "llm")))] == 1
    assert s[("kvserve:time_to_first_token_seconds_bucket", (("le", "0.06"), ("model", "llm")))] == 0
