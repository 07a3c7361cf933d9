"""Embeddings are observed as generation is: one trace (gateway SERVER and CLIENT
spans, the embed model's llm_request with gen_ai.operation.name "embeddings"),
the prompt token counter and batch-size histogram on /metrics, and a "request
finished" line carrying the gateway's request id."""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.backend.embed.embed_fixtures import minilm_dir
from tests.observability_e2e.obs_e2e_support import Server, metric_value, new_traceparent, run_server
from tests.utils.otlp_receiver import OTLPReceiver

EMBED = "obs-minilm"
SERVER_SPAN = "POST /v1/embeddings"
CLIENT_SPAN = "inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def server(llama_dir: str) -> Iterator[Server]:
    with OTLPReceiver(protocol="http/protobuf") as rx:
        env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        args = ["--otlp-traces-endpoint", rx.endpoint, "--embedding-model", minilm_dir(),
                "--embedding-served-model-name", EMBED]
        with run_server(llama_dir, args, env, rx) as s:
            yield s


def test_one_trace_with_embeddings_attributes(server: Server) -> None:
    header, trace_id, client_span = new_traceparent()
    status, _, raw = server.request("POST", "/v1/embeddings", {"model": EMBED, "input": ["one text", "two texts"]},
                                    {"traceparent": header, "X-Request-Id": "embed-trace-1"})
    assert status == 200, raw
    tokens = json.loads(raw)["usage"]["prompt_tokens"]
    rx = server.receiver
    assert rx is not None
    rx.wait_for_spans(name="llm_request", trace_id=trace_id)
    rx.wait_for_spans(name=SERVER_SPAN, trace_id=trace_id)
    spans = {s.name: s for s in rx.find(trace_id=trace_id)}
    gateway, client, backend = spans[SERVER_SPAN], spans[CLIENT_SPAN], spans["llm_request"]
    assert gateway.parent_span_id == client_span and client.parent_span_id == gateway.span_id
    assert backend.parent_span_id == client.span_id and backend.resource["service.name"] == "kvserve-backend"
    for span in (gateway, backend):
        assert span.attributes["gen_ai.operation.name"] == "embeddings"
        assert span.attributes["gen_ai.request.model"] == EMBED
        assert span.attributes["gen_ai.usage.input_tokens"] == tokens
        assert span.attributes["kvserve.embedding.inputs"] == 2
    lines = server.wait_for_log(lambda line: "embed-trace-1" in line and "request finished" in line)
    (line,) = [json.loads(x) for x in lines if "embed-trace-1" in x and "request finished" in x]
    assert line["prompt_tokens"] == tokens and line["inputs"] == 2 and line["trace_id"] == trace_id


def test_metrics_count_prompt_tokens_and_batches(server: Server) -> None:
    before = server.metrics()
    status, _, raw = server.request("POST", "/v1/embeddings", {"model": EMBED, "input": ["a", "b", "c"]})
    assert status == 200
    after = server.metrics()
    tokens = json.loads(raw)["usage"]["prompt_tokens"]
    embed = {"model": "embed"}
    assert (metric_value(after, "kvserve:prompt_tokens_total", **embed)
            - metric_value(before, "kvserve:prompt_tokens_total", **embed)) == tokens
    assert (metric_value(after, "kvserve:embedding_batch_size_sum", **embed)
            - metric_value(before, "kvserve:embedding_batch_size_sum", **embed)) == 3
    assert (metric_value(after, "kvserve:request_success_total", finished_reason="stop", **embed)
            - metric_value(before, "kvserve:request_success_total", finished_reason="stop", **embed)) == 1
