"""Every integer a client sets fits in an int64 before it reaches a span attribute.

A `seed` of 2**63 (or a `top_k`, `max_tokens` beyond int64 where the gateway did not know
the context length) became a gen_ai.request.* attribute that the OTLP exporter could not
encode: the request succeeded, the exporter logged an error and the whole batch of spans,
other requests' included, was lost. Now such values are a 400 naming the field, and every
span reaches the collector.
"""
from __future__ import annotations

import time

import pytest

from tests.conftest import tiny_model
from tests.reliability.served import Served, start_served
from tests.utils.otlp_receiver import OTLPReceiver

OVER_INT64 = [("seed", 2**63), ("seed", -(2**63) - 1), ("top_k", 2**63), ("max_tokens", 2**64), ("n", 2**63)]


@pytest.fixture(scope="module")
def traced() -> tuple[Served, OTLPReceiver]:
    with OTLPReceiver(protocol="http/protobuf") as rx:
        env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        served = start_served(["--model", tiny_model("llama"), "--served-model-name", "tiny",
                               "--otlp-traces-endpoint", rx.endpoint], env={**env, "OTEL_TRACES_EXPORTER": "otlp"})
        try:
            yield served, rx
        finally:
            served.stop(timeout=60)


def test_integers_beyond_int64_are_400_and_every_span_is_exported(traced: tuple[Served, OTLPReceiver]) -> None:
    served, rx = traced
    mark = served.log_mark()
    for path in ("/v1/completions", "/v1/chat/completions"):
        base = {"model": "tiny", "max_tokens": 2, "temperature": 1.0}
        base.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]})
        for name, value in OVER_INT64:
            reply = served.post(path, {**base, name: value})
            assert reply.status == 400 and reply.json()["error"]["param"] == name, (path, name, reply.body[:200])
    # The largest int64 seed is fine, and its span carries it exactly.
    good = served.post("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2, "seed": 2**63 - 1,
                                           "temperature": 1.0})
    assert good.status == 200, good.body[:200]
    spans = rx.wait_for_spans(predicate=lambda s: s.kind == "SERVER" and
                              s.attributes.get("gen_ai.request.seed") == 2**63 - 1, timeout=15)
    assert spans
    # Every request's server span arrived (2 x 5 refused + 1), and the exporter never complained.
    server_spans = rx.wait_for_spans(predicate=lambda s: s.kind == "SERVER" and
                                     s.attributes.get("http.route", "").endswith("completions"), count=11, timeout=15)
    assert len(server_spans) >= 11
    time.sleep(0.5)
    logs = "".join(served.logs_since(mark))
    for sign in ("Failed to export", "Exception while exporting", "Invalid type", "out of range", "Traceback"):
        assert sign not in logs, (sign, logs[-2000:])
