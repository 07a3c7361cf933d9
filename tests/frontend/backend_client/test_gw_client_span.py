"""The gateway's gRPC client span follows OpenTelemetry's gRPC conventions for its status."""
from __future__ import annotations

from opentelemetry.trace import StatusCode

from kvserve.frontend.backend_client.tracing_seam import GRPC_CANCELLED, GRPC_OK, start_client_span
from kvserve.observability.tracing import setup_tracing


def test_a_client_span_is_an_error_for_every_grpc_code_but_ok() -> None:
    setup_tracing()  # a recording provider, nothing exported
    ok, cancelled, failed = (start_client_span("127.0.0.1:1", "llm", f"r{i}") for i in range(3))
    ok.end(GRPC_OK)
    cancelled.end(GRPC_CANCELLED)  # the HTTP client left, so the gateway cancelled the call
    failed.end(GRPC_OK, "context_length_exceeded")  # an in-band model error on an OK stream
    assert ok.span.status.status_code == StatusCode.UNSET
    assert cancelled.span.status.status_code == StatusCode.ERROR
    assert cancelled.span.attributes["rpc.grpc.status_code"] == GRPC_CANCELLED
    assert failed.span.status.status_code == StatusCode.ERROR
